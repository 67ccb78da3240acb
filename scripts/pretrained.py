"""Add a finished training run to the pretrained checkpoints (`pretrained/`, its manifest).

    python scripts/pretrained.py add outputs/hopper/medium-v0/<run> \
        --planner <tt-eval run dir> --bc <tt-eval run dir with planner=bc>

writes the run's planning model (`model.pt`: no optimiser state) to
`pretrained/<dataset id>.pt`, its parameters in float16 where that leaves the model's
predictions unchanged within tolerance (else float32), and its manifest entry, by dataset id:

* the dataset and its content fingerprint;
* the training command (the run's own Hydra overrides), the commit it was trained at (given, or
  this checkout's) and its wall time;
* the scores of the planner and of BC (mean and standard error of the normalised score over
  their episodes), each with its evaluation command (the evaluation's own overrides);
* the stored dtype and how far float16 moved the model's predictions.

`--out` writes to another folder (its own `manifest.json`), as `TT_PRETRAINED_DIR` reads one.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf

from trajectory_transformer.checkpoint import (
    PLANNING_MODEL,
    compact_planning_payload,
    read_payload,
    save_atomic,
    value_targets_of,
)
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import joint_transitions
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import GPTConfig, TrajectoryGPT

REPOSITORY = Path(__file__).resolve().parents[1]
AGREEMENT = 0.99
"""float16 is kept where at least this share of the model's most likely tokens is unchanged..."""
LOG_PROB_TOLERANCE = 0.05
"""... and no log-probability of those tokens moves by more than this."""
WINDOWS = 256  # dataset windows the two precisions are compared on


def overrides_of(run_dir: Path) -> list[str]:
    """The command-line overrides a Hydra run was started with (`.hydra/overrides.yaml`)."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        raise SystemExit(f"{run_dir} has no .hydra/overrides.yaml: give a tt-train or tt-eval run")
    return [str(item) for item in OmegaConf.to_container(OmegaConf.load(path)) or []]


def score_of(eval_dir: Path, command: str) -> dict:
    """An evaluation's normalised score (mean, standard error, episodes) and its command."""
    results = json.loads((eval_dir / "results.json").read_text())
    overrides = [o for o in overrides_of(eval_dir) if not o.startswith("checkpoint=")]
    return {
        "normalized_score_mean": round(results["normalized_score_mean"], 2),
        "normalized_score_stderr": round(results["normalized_score_stderr"], 2),
        "episodes": len(results["returns"]),
        "command": " ".join([command, "checkpoint=pretrained:<dataset id>", *overrides]),
    }


def predictions_moved(payload: dict, compact: dict, seed: int = 0) -> tuple[float, float]:
    """On `WINDOWS` windows of the run's dataset: the share of the most likely next tokens
    that the compact weights leave unchanged, and the largest change of their
    log-probabilities."""
    config = GPTConfig(**payload["model_config"])
    models = []
    for weights in (payload["model"], compact["model"]):
        model = TrajectoryGPT(config)
        model.load_state_dict(weights)
        models.append(model.eval())
    discretizer = Discretizer.from_state_dict(payload["discretizer"])
    episodes, _ = load_episodes(payload["dataset"]["dataset_id"])
    discount, penalty = value_targets_of(payload["config"])
    transitions = joint_transitions(episodes, discount, penalty)
    windows = TokenWindows(
        transitions,
        episodes.lengths,
        discretizer,
        config.sequence_transitions,
        config.value_inputs,
    )
    ids = torch.as_tensor(np.random.default_rng(seed).choice(len(windows), WINDOWS))
    tokens, _, values = windows.batch(ids)
    with torch.no_grad():
        full, half = (
            model(tokens[:, :-1], values[:, :-1] if values is not None else None)
            for model in models
        )
    full, half = full.log_softmax(-1), half.log_softmax(-1)
    best = full.argmax(-1)
    agreement = (half.argmax(-1) == best).float().mean().item()
    moved = (full.gather(-1, best[..., None]) - half.gather(-1, best[..., None])).abs().max()
    return agreement, moved.item()


def commit_of_checkout() -> str:
    return subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=REPOSITORY, capture_output=True, text=True, check=True
    ).stdout.strip()


def add(args: argparse.Namespace) -> Path:
    run_dir = Path(args.run)
    payload = read_payload(run_dir / PLANNING_MODEL)
    dataset = payload["dataset"]
    name = dataset["dataset_id"]
    compact = compact_planning_payload(payload)
    agreement, moved = predictions_moved(payload, compact)
    kept = agreement >= AGREEMENT and moved <= LOG_PROB_TOLERANCE
    stored = compact if kept else payload
    out = Path(args.out)
    file = name.replace("/", "-") + ".pt"
    path = save_atomic(stored, out / file)
    training = payload.get("training") or {}
    entry = {
        "file": file,
        "dataset": name,
        "dataset_fingerprint": dataset.get("fingerprint"),
        "training": {
            "command": " ".join(["tt-train", *overrides_of(run_dir)]),
            "commit": args.commit or commit_of_checkout(),
            "wall_seconds": round(training.get("elapsed_seconds", float("nan")), 1),
            "steps": training.get("step"),
            "weights_of": training.get("weights_of"),
        },
        "scores": {
            "planner": score_of(Path(args.planner), "tt-eval"),
            "bc": score_of(Path(args.bc), "tt-eval"),
        },
        "weights_dtype": "float16" if kept else "float32",
        "float16_agreement": round(agreement, 4),
        "float16_log_prob_change": round(moved, 4),
        "bytes": path.stat().st_size,
    }
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.is_file() else {}
    manifest.setdefault("checkpoints", {})[name] = entry
    manifest["checkpoints"] = dict(sorted(manifest["checkpoints"].items()))
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    print(
        f"{name}: {path} ({entry['bytes']:,} bytes, {entry['weights_dtype']}; float16 keeps "
        f"{agreement:.2%} of the most likely tokens, log-probabilities within {moved:.3g})"
    )
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add", help="add a finished training run")
    adding.add_argument("run", help="tt-train's run directory (its model.pt)")
    adding.add_argument("--planner", required=True, help="tt-eval run dir of the planner")
    adding.add_argument("--bc", required=True, help="tt-eval run dir with planner=bc")
    adding.add_argument("--commit", help="the commit it was trained at (default: HEAD)")
    adding.add_argument("--out", default=str(REPOSITORY / "pretrained"))
    args = parser.parse_args(argv)
    add(args)


if __name__ == "__main__":
    sys.exit(main())
