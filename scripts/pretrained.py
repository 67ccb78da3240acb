"""Add a finished training run to the pretrained checkpoints (`pretrained/`, its manifest).

    python scripts/pretrained.py add outputs/hopper/medium-v0/<run> \
        --planner <tt-eval run dir> --bc <tt-eval run dir with planner=bc>

writes the run's planning model (`model.pt`: no optimiser state) to
`pretrained/<dataset id>.pt`, its parameters in float16 where that leaves the model's
predictions unchanged within tolerance (else, or with `--float32`, float32), and its manifest
entry, by dataset id:

* the dataset and its content fingerprint;
* the training command (the run's own Hydra overrides), the commit it was trained at (given, or
  this checkout's), its wall time and the machine (given);
* the scores of the planner and of BC (mean and standard error of the normalised score over
  their episodes), each with its evaluation command (the evaluation's own overrides);
* the planner's settings that command composes to, where they differ from `PlannerConfig`'s
  defaults: what `BeamPlanner.from_pretrained` plans with, the planning package reading no
  Hydra config;
* the stored dtype and how far float16 moved the model's predictions.

`--out` writes to another folder (its own `manifest.json`), as `TT_PRETRAINED_DIR` reads one.

    python scripts/pretrained.py rescore pointmaze/umaze-v0 --planner <tt-eval run dir>

scores an installed checkpoint again, its weights and training unchanged: the planner's (or,
with `--bc`, BC's) score and command are those of a tt-eval run of
`checkpoint=pretrained:<dataset id>`, and the planner settings are what the new command
composes to (another planner preset, say).

    python scripts/pretrained.py check            # make results

evaluates every pretrained checkpoint again with its manifest's planner and BC commands (`--jobs`
evaluations at a time, one thread each), and compares each score with the manifest's: it agrees
where the two differ by at most twice their combined standard error, or by at most one
normalised point. It writes the table of what it measured to the record
`pretrained/scores` (docs/results/records/pretrained/scores.json, rendered by
scripts/render_results.py) and exits with 1 if a score disagrees.

    python scripts/pretrained.py check --only hopper/medium-v0

evaluates the checkpoints named alone (one just added) and updates their rows of the record,
keeping the others' as the last full check measured them.

    python scripts/pretrained.py check --resume   # make results RESUME=1

continues a check that was interrupted (Ctrl-C or SIGTERM, which end its running evaluations
too; a failed evaluation; a machine that went away), in the same `--out`: the episodes its
evaluations had finished are kept, and the record's wall time adds the time each run took.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import fields
from datetime import date
from pathlib import Path

import numpy as np
import torch
from omegaconf import OmegaConf
from render_results import format_record

from trajectory_transformer.checkpoint import (
    PLANNING_MODEL,
    PRETRAINED,
    compact_planning_payload,
    pretrained_manifest,
    read_payload,
    save_atomic,
    value_targets_of,
)
from trajectory_transformer.cli import common as cli_common
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import joint_transitions
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.model import GPTConfig, TrajectoryGPT
from trajectory_transformer.planning import PlannerConfig

REPOSITORY = Path(__file__).resolve().parents[1]
RESUME_HINT = "`make results RESUME=1` (scripts/pretrained.py check --resume)"
AGREEMENT = 0.99
"""float16 is kept where at least this share of the model's most likely tokens is unchanged..."""
LOG_PROB_TOLERANCE = 0.05
"""... and no log-probability of those tokens moves by more than this."""
WINDOWS = 256  # dataset windows the two precisions are compared on
SCORE_FLOOR = 1.0
"""Normalised points two measurements of one score may always differ by (see `agrees`)."""


def overrides_of(run_dir: Path) -> list[str]:
    """The command-line overrides a Hydra run was started with (`.hydra/overrides.yaml`)."""
    path = run_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        raise SystemExit(f"{run_dir} has no .hydra/overrides.yaml: give a tt-train or tt-eval run")
    return [str(item) for item in OmegaConf.to_container(OmegaConf.load(path)) or []]


def score_of(eval_dir: Path) -> dict:
    """A tt-eval run's normalised score (mean, standard error, episodes) and its command, for
    any pretrained checkpoint (`evaluation_overrides` reads it back)."""
    results = json.loads((eval_dir / "results.json").read_text())
    overrides = [o for o in overrides_of(eval_dir) if not o.startswith("checkpoint=")]
    return {
        "normalized_score_mean": round(results["normalized_score_mean"], 2),
        "normalized_score_stderr": round(results["normalized_score_stderr"], 2),
        "episodes": len(results["returns"]),
        "command": "tt-eval checkpoint=pretrained:<dataset id> " + shlex.join(overrides),
    }


def evaluation_overrides(name: str, recorded: dict) -> list[str]:
    """The tt-eval overrides of a manifest's evaluation command, for the checkpoint `name`."""
    return shlex.split(recorded["command"].replace("<dataset id>", name))[1:]


def planner_settings(name: str, recorded: dict) -> dict:
    """The planner's settings that the manifest's evaluation command of checkpoint `name`
    composes to, where they differ from `PlannerConfig`'s defaults."""
    overrides = evaluation_overrides(name, recorded)
    composed = PlannerConfig(**cli_common.planner_settings(overrides))
    defaults = PlannerConfig()
    return {
        field.name: getattr(composed, field.name)
        for field in fields(PlannerConfig)
        if getattr(composed, field.name) != getattr(defaults, field.name)
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


def read_manifest(out: Path) -> dict:
    """The manifest in the folder `out`; empty where it has none yet."""
    path = out / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def write_manifest(out: Path, manifest: dict) -> None:
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


def add(args: argparse.Namespace) -> Path:
    run_dir = Path(args.run)
    payload = read_payload(run_dir / PLANNING_MODEL)
    dataset = payload["dataset"]
    name = dataset["dataset_id"]
    compact = compact_planning_payload(payload)
    agreement, moved = predictions_moved(payload, compact)
    kept = agreement >= AGREEMENT and moved <= LOG_PROB_TOLERANCE and not args.float32
    stored = compact if kept else payload
    out = Path(args.out)
    file = name.replace("/", "-") + ".pt"
    path = save_atomic(stored, out / file)
    training = payload.get("training") or {}
    # The run's whole wall time: the weights may be an earlier step's (the best validation),
    # and the run went on until its stopping rule could tell.
    last = run_dir / "checkpoint.pt"
    run_state = (read_payload(last).get("training") or {}) if last.is_file() else training
    scores = {"planner": score_of(Path(args.planner)), "bc": score_of(Path(args.bc))}
    entry = {
        "file": file,
        "dataset": name,
        "dataset_fingerprint": dataset.get("fingerprint"),
        "training": {
            # A resumed run trains as the uninterrupted one: its resume= is not the recipe.
            "command": shlex.join(
                ["tt-train", *(o for o in overrides_of(run_dir) if not o.startswith("resume="))]
            ),
            "commit": args.commit or commit_of_checkout(),
            "wall_seconds": round(run_state.get("elapsed_seconds", float("nan")), 1),
            "steps": run_state.get("step"),
            "steps_of_weights": training.get("step"),
            "weights_of": training.get("weights_of"),
            "machine": args.machine,
        },
        "scores": scores,
        "planner_settings": planner_settings(name, scores["planner"]),
        "weights_dtype": "float16" if kept else "float32",
        "float16_agreement": round(agreement, 4),
        "float16_log_prob_change": round(moved, 4),
        "bytes": path.stat().st_size,
    }
    manifest = read_manifest(out)
    manifest.setdefault("checkpoints", {})[name] = entry
    manifest["checkpoints"] = dict(sorted(manifest["checkpoints"].items()))
    write_manifest(out, manifest)
    print(
        f"{name}: {path} ({entry['bytes']:,} bytes, {entry['weights_dtype']}; float16 keeps "
        f"{agreement:.2%} of the most likely tokens, log-probabilities within {moved:.3g})"
    )
    return path


def rescore(args: argparse.Namespace) -> None:
    manifest_path = Path(args.out) / "manifest.json"
    manifest = read_manifest(Path(args.out))
    checkpoints = manifest.get("checkpoints", {})
    if args.name not in checkpoints:
        raise SystemExit(
            f"error: {args.name} is not in {manifest_path} (it has "
            f"{', '.join(checkpoints) or 'none'}); add a training run with `add`"
        )
    runs = {agent: Path(run) for agent, run in (("planner", args.planner), ("bc", args.bc)) if run}
    if not runs:
        raise SystemExit("error: give --planner or --bc (or both): the tt-eval runs to score")
    entry = checkpoints[args.name]
    for agent, run in runs.items():
        # The installed weights, not the run they came from: float16 may move a score.
        played = [o.split("=", 1)[1] for o in overrides_of(run) if o.startswith("checkpoint=")]
        if played[-1:] != [f"{PRETRAINED}{args.name}"]:
            raise SystemExit(
                f"error: {run} evaluated checkpoint={played[-1] if played else '(none)'}; "
                f"score the installed weights: tt-eval checkpoint={PRETRAINED}{args.name} ..."
            )
        entry["scores"][agent] = score_of(run)
    entry["planner_settings"] = planner_settings(args.name, entry["scores"]["planner"])
    write_manifest(Path(args.out), manifest)
    for agent in runs:
        score = entry["scores"][agent]
        print(
            f"{args.name} {agent}: {score['normalized_score_mean']} ± "
            f"{score['normalized_score_stderr']} ({score['command']})"
        )


def agrees(score: float, stderr: float, recorded: dict) -> bool:
    """Two measurements of one score agree where they differ by at most twice their combined
    standard error, or by at most `SCORE_FLOOR`: a score every episode reaches alike (a pendulum
    held up to the end) has a standard error near zero, and another CPU's floats or float16
    weights move it by hundredths."""
    spread = math.hypot(stderr, recorded["normalized_score_stderr"])
    return abs(score - recorded["normalized_score_mean"]) <= max(2 * spread, SCORE_FLOOR)


RUNNING: set[subprocess.Popen] = set()
"""The check's tt-eval processes now running: a stop sent to the check alone reaches them."""


def evaluate_again(
    name: str,
    recorded: dict,
    run_dir: Path,
    extra: list[str],
    threads: int | None = None,
    resume: bool = False,
) -> dict:
    """Run a manifest's evaluation command again, into `run_dir`; its results.json. A
    previous check's run there is removed first, since tt-eval would keep its episodes instead
    of playing them again; with `resume`, an interrupted check, it is kept, and tt-eval plays
    only the episodes it had not finished (refusing them where the checkpoint, the planner
    settings or the env differ)."""
    if not resume:
        shutil.rmtree(run_dir, ignore_errors=True)
    overrides = evaluation_overrides(name, recorded)
    module = "trajectory_transformer.cli.evaluate"
    command = [sys.executable, "-m", module, *overrides, *extra, f"hydra.run.dir={run_dir}"]
    environment = dict(os.environ, OMP_NUM_THREADS=str(threads)) if threads else None
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    with subprocess.Popen(command, env=environment, **pipes) as evaluation:
        RUNNING.add(evaluation)
        try:
            _, stderr = evaluation.communicate()
        finally:
            RUNNING.discard(evaluation)
    if evaluation.returncode != 0:
        again = "" if resume else f" ({RESUME_HINT} continues this check, keeping what finished)"
        raise SystemExit(f"{name}: tt-eval {shlex.join(overrides)} failed{again}:\n{stderr}")
    return json.loads((run_dir / "results.json").read_text())


@contextmanager
def stopped_as_by_ctrl_c():
    """SIGTERM (a scheduler, a machine going away) and SIGINT stop a check as Ctrl-C does:
    the running evaluations end, their finished episodes kept for `--resume`. SIGINT is set
    again because a shell starting the check in the background (`cmd &`) ignores it."""

    def stop(signum: int, frame: object) -> None:
        for evaluation in list(RUNNING):
            evaluation.terminate()
        raise KeyboardInterrupt

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers
        return
    before = {number: signal.signal(number, stop) for number in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)


def check(args: argparse.Namespace) -> int:
    manifest = pretrained_manifest()
    if not manifest:
        print("no pretrained checkpoints are installed")
        return 0
    unknown = sorted(set(args.only or ()) - set(manifest))
    if unknown:
        raise SystemExit(
            f"--only {' '.join(unknown)}: not in the manifest, whose checkpoints are "
            f"{', '.join(manifest)}"
        )
    checked = [name for name in manifest if not args.only or name in args.only]
    started, rows, disagreements = time.monotonic(), [], []
    # The evaluations' wall time over every run of this check, an interrupted one's included.
    clock = Path(args.out) / "check-time.json"
    before = json.loads(clock.read_text()) if args.resume and clock.is_file() else {}
    runs, seconds_before = before.get("runs", 0) + 1, before.get("seconds", 0.0)
    # Every planner before any BC: BC plays in seconds what the planner plays in minutes, so
    # the short runs fill the cores at the end instead of one long one running alone.
    evaluations = [(name, agent) for agent in ("planner", "bc") for name in checked]
    # Evaluations side by side, one thread each: the cores are used, and each score is what
    # it is alone, within float rounding.
    threads = 1 if args.jobs > 1 else None

    def again(evaluation: tuple[str, str]) -> dict:
        name, agent = evaluation
        recorded, run_dir = manifest[name]["scores"][agent], Path(args.out) / name / agent
        return evaluate_again(name, recorded, run_dir, args.extra, threads, args.resume)

    def keep_time() -> None:
        clock.parent.mkdir(parents=True, exist_ok=True)
        seconds = seconds_before + time.monotonic() - started
        clock.write_text(json.dumps({"runs": runs, "seconds": round(seconds, 1)}) + "\n")

    pool, measured = ThreadPoolExecutor(max_workers=args.jobs), {}
    try:
        running = {pool.submit(again, evaluation): evaluation for evaluation in evaluations}
        for done in as_completed(running):  # each as it ends: a full check takes an hour
            (name, agent), results = running[done], done.result()
            measured[name, agent] = results
            print(
                f"[{len(measured)}/{len(evaluations)}] {name} {agent}: "
                f"{results['normalized_score_mean']:.1f} ± "
                f"{results['normalized_score_stderr']:.1f} "
                f"({results['wall_seconds'] / 60:.1f} min)",
                flush=True,
            )
    except KeyboardInterrupt:
        print(f"interrupted: {RESUME_HINT} continues it", file=sys.stderr)
        raise
    finally:
        # Stopped (Ctrl-C, a failed evaluation): start no more; --resume adds the time taken.
        pool.shutdown(cancel_futures=True)
        keep_time()
    for name in checked:
        entry, row = manifest[name], [name]
        for agent in ("planner", "bc"):
            recorded = entry["scores"][agent]
            results = measured[name, agent]
            score, stderr = results["normalized_score_mean"], results["normalized_score_stderr"]
            ok = agrees(score, stderr, recorded)
            if not ok:
                disagreements.append(f"{name} {agent}")
            was = "{normalized_score_mean:.1f} ± {normalized_score_stderr:.1f}".format(**recorded)
            now = f"{score:.1f} ± {stderr:.1f}"
            row += [was, now if ok else f"{now} (disagrees)"]
            print(f"{name} {agent}: {now}, manifest {was}: {'agrees' if ok else 'DISAGREES'}")
        rows.append(row)
    minutes = json.loads(clock.read_text())["seconds"] / 60
    path = Path(args.record)
    record = scores_record(path, manifest, rows, minutes, runs, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(format_record(record))
    over = f" over {runs} runs" if runs > 1 else ""
    print(f"{len(checked)} checkpoints in {minutes:.1f} minutes{over}; table: {path}")
    if disagreements:
        print(f"disagree with the manifest: {', '.join(disagreements)}")
        return 1
    return 0


def scores_record(
    path: Path,
    manifest: dict,
    rows: list[list[str]],
    minutes: float,
    runs: int,
    args: argparse.Namespace,
) -> dict:
    """The record of a check: its rows, or with `--only` the record at `path` with the rows
    of the checkpoints checked replaced (added where new, removed where no longer in the
    manifest), its provenance extended and its note saying which were evaluated when."""
    machine, today = f"{platform.machine()}, {args.machine}", date.today().isoformat()
    resumed = f"; over {runs} runs, continued with `--resume`" if runs > 1 else ""
    note = (
        f"Every pretrained checkpoint evaluated again in {minutes:.0f} minutes "
        f"({args.machine}{resumed}); normalised scores, mean ± standard error over the "
        "manifest's evaluation episodes. A score agrees with the manifest's where they differ "
        "by at most twice their combined standard error, or by at most one point."
    )
    provenance = {"commands": ["make results"], "machines": [machine], "dates": [today]}
    if args.only and path.is_file():
        before = json.loads(path.read_text())
        merged = {row[0]: row for row in before["rows"]} | {row[0]: row for row in rows}
        rows = [merged[name] for name in manifest if name in merged]
        provenance = before["provenance"]
        command = "python scripts/pretrained.py check --only " + " ".join(args.only)
        for key, value in (("commands", command), ("machines", machine), ("dates", today)):
            if value not in provenance[key]:
                provenance[key].append(value)
        # One sentence names every checkpoint checked by name since the full check, each
        # with its latest date, however often `--only` runs.
        by_name = before.get("checked_by_name", {}) | dict.fromkeys(args.only, today)
        by_name = {name: by_name[name] for name in manifest if name in by_name}
        note = before.get("full_check_note", before["note"])
        return {
            **scores_head(provenance, note + " " + by_name_sentence(by_name), rows),
            "full_check_note": note,
            "checked_by_name": by_name,
        }
    return scores_head(provenance, note, rows)


def scores_head(provenance: dict, note: str, rows: list[list[str]]) -> dict:
    return {
        "title": "Pretrained checkpoints, evaluated again",
        "page": "docs/results/pretrained.md",
        "provenance": provenance,
        "note": note,
        "columns": ["dataset", "planner (manifest)", "planner", "BC (manifest)", "BC"],
        "rows": rows,
    }


def by_name_sentence(by_name: dict[str, str]) -> str:
    """`Checked again by name (--only): a (date), b (date).`"""
    checked = ", ".join(f"{name} ({day})" for name, day in by_name.items())
    return f"Checked again by name (`--only`): {checked}."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    adding = commands.add_parser("add", help="add a finished training run")
    adding.add_argument("run", help="tt-train's run directory (its model.pt)")
    adding.add_argument("--planner", required=True, help="tt-eval run dir of the planner")
    adding.add_argument("--bc", required=True, help="tt-eval run dir with planner=bc")
    adding.add_argument(
        "--float32",
        action="store_true",
        help="store float32 weights even where float16 keeps the predictions (a checkpoint "
        "whose float16 weights score otherwise in `check`)",
    )
    adding.add_argument("--commit", help="the commit it was trained at (default: HEAD)")
    adding.add_argument(
        "--machine", default="2-core CPU", help="where it was trained, and what ran beside it"
    )
    adding.add_argument("--out", default=str(REPOSITORY / "pretrained"))
    rescoring = commands.add_parser(
        "rescore", help="score an installed checkpoint again (another planner, say)"
    )
    rescoring.add_argument("name", help="its dataset id, as the manifest names it")
    rescoring.add_argument(
        "--planner", help="tt-eval run dir of checkpoint=pretrained:<name> with the planner"
    )
    rescoring.add_argument("--bc", help="tt-eval run dir of checkpoint=pretrained:<name> with BC")
    rescoring.add_argument("--out", default=str(REPOSITORY / "pretrained"))
    checking = commands.add_parser("check", help="evaluate every pretrained checkpoint again")
    checking.add_argument("--out", default="outputs/results", help="the evaluations' run dirs")
    checking.add_argument(
        "--record", default=str(REPOSITORY / "docs/results/records/pretrained/scores.json")
    )
    checking.add_argument("--machine", default="2-core CPU", help="named in the record")
    checking.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="evaluations run at a time"
    )
    checking.add_argument(
        "--only",
        nargs="+",
        metavar="NAME",
        help="evaluate these checkpoints alone (e.g. one just added) and update their rows of "
        "the record, keeping the others'",
    )
    checking.add_argument(
        "--resume",
        action="store_true",
        help="continue an interrupted check (same --out): keep the episodes its evaluations "
        "had finished, and count the time it had taken",
    )
    checking.add_argument("extra", nargs="*", help="tt-eval overrides for every evaluation")
    args = parser.parse_args(argv)
    if args.command == "check":
        with stopped_as_by_ctrl_c():
            return check(args)
    if args.command == "rescore":
        rescore(args)
        return 0
    add(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
