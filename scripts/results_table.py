"""Regenerate the results table: dataset vs behaviour cloning vs beam planner, several seeds.

For each dataset and training seed it runs `tt-train` (skipped when a finished checkpoint is
already there, continued from one that is not), then `tt-eval` with the beam planner and with
`planner=bc` (reused when that evaluation is already there with the same settings), and prints a
markdown table of normalised scores (mean ± standard error over training seeds; each seed's
score is the mean over its evaluation episodes).

    python scripts/results_table.py                                  # the Pendulum table
    python scripts/results_table.py --datasets pendulum-medium --seeds 0 --episodes 5
    python scripts/results_table.py --datasets hopper-embedded-medium:0,1,2 \\
        hopper-embedded-medium-expert:0 --episodes 10   # seeds per dataset
    python scripts/results_table.py --datasets pointmaze-umaze-paper:0,1,2 --planner paper

`--record docs/results/records/<name>.json` also writes the table as a results record, with the
command, machine and date, from which `scripts/render_results.py` writes the pages' tables
that show it (`<!-- results: <name> -->`):

    python scripts/results_table.py --record docs/results/records/planner-scores/pendulum.json

A dataset whose episodes are not episodes of its evaluation task (pointmaze/*: each ends at a
goal drawn at random, with a return of 1) is represented in the table by its behaviour policy's
score in the evaluation env, which its metadata records, and the table says so.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml
from hydra.errors import HydraException
from omegaconf.errors import OmegaConfBaseException
from render_results import write_measured

from trajectory_transformer.checkpoint import read_payload
from trajectory_transformer.cli.common import compose, override_error
from trajectory_transformer.data.minari_source import load_episodes, load_minari
from trajectory_transformer.scores import mean_and_stderr, normalized_score
from trajectory_transformer.suites import pointmaze


def dataset_id(preset: str) -> str:
    """The Minari id a dataset preset (`configs/dataset/<preset>.yaml`) trains on; a
    ValueError that names the close presets otherwise."""
    try:
        return compose("train", [f"dataset={preset}"]).dataset.id
    except (HydraException, OmegaConfBaseException) as error:
        raise ValueError(override_error(error, "train", [f"dataset={preset}"])) from None


BEHAVIOUR_SCORED = {f"pointmaze/{maze}-v0" for maze in pointmaze.MAZES}
"""Datasets represented by their behaviour policy's score (see the module docstring)."""


def run(command: list[str]) -> None:
    print("$", " ".join(command), flush=True)
    subprocess.run(command, check=True)


def train(dataset: str, seed: int, run_dir: Path, overrides: list[str]) -> Path:
    """The finished checkpoint of one training seed; a run that was interrupted continues
    from its checkpoint."""
    checkpoint = run_dir / "checkpoint.pt"
    resume = []
    if checkpoint.exists():
        if read_payload(checkpoint)["training"]["finished"]:
            return checkpoint
        resume = [f"resume={checkpoint}"]
    bin_dir = Path(sys.executable).parent
    run(
        [
            str(bin_dir / "tt-train"),
            f"dataset={dataset}",
            f"seed={seed}",
            f"hydra.run.dir={run_dir}",
            *overrides,
            *resume,
        ]
    )
    return checkpoint


def training_minutes(checkpoint: Path) -> float | None:
    """The training's wall time by its own clock, which a resumed run carries on; None for a
    checkpoint older than that clock."""
    seconds = read_payload(checkpoint)["training"].get("elapsed_seconds")
    return None if seconds is None else seconds / 60


def setting_of(settings: dict, override: str) -> bool:
    """Whether an evaluation's recorded `settings` hold the tt-eval `override` (key=value)."""
    key, _, value = override.partition("=")
    node = settings
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node == yaml.safe_load(value)


# Overrides that do not change how an episode plays (each episode has its own seed), as
# tt-eval's `evaluation_identity` leaves them out: an evaluation made with others is reused.
PLAY_INDEPENDENT = ("eval.num_envs", "eval.progress", "device")


def evaluate(checkpoint: Path, planner: str, episodes: int, overrides: list[str]) -> dict:
    """The evaluation's results.json; one already on disk with the same episodes and
    overrides (those of `PLAY_INDEPENDENT` aside) is reused, one with others replaced. An
    evaluation interrupted before its results.json continues (tt-eval keeps its finished
    episodes in the run directory)."""
    run_dir = checkpoint.parent / f"eval_{planner}"
    results = run_dir / "results.json"
    if results.exists():
        summary = json.loads(results.read_text())
        settings = summary["settings"]
        deciding = [o for o in overrides if o.partition("=")[0] not in PLAY_INDEPENDENT]
        if len(summary["returns"]) == episodes and all(setting_of(settings, o) for o in deciding):
            return summary
        (run_dir / "episodes.jsonl").unlink(missing_ok=True)  # another evaluation: start over
    bin_dir = Path(sys.executable).parent
    run(
        [
            str(bin_dir / "tt-eval"),
            f"checkpoint={checkpoint.parent}",  # the model the run handed over
            f"planner={planner}",
            f"eval.episodes={episodes}",
            "eval.progress=false",
            f"hydra.run.dir={run_dir}",
            *overrides,
        ]
    )
    return json.loads(results.read_text())


def dataset_score(dataset_id: str) -> float:
    """The mean normalised score of the dataset's episodes, or for `BEHAVIOUR_SCORED` ones
    its behaviour policy's score in the evaluation env, which their metadata records."""
    if dataset_id in BEHAVIOUR_SCORED:
        metadata = load_minari(dataset_id).storage.metadata
        return float(metadata["behaviour_policy"]["normalized_score"])
    episodes, info = load_episodes(dataset_id)
    scores = normalized_score(episodes.episode_returns(), info.ref_min_score, info.ref_max_score)
    return float(scores.mean())


def write_record(path: Path, columns: list[str], rows: list[list[str]], note: str) -> None:
    """The table as a results record (docs/results/records/), in scripts/render_results.py's
    format, with the command that measured it, the machine and the date."""
    title = "Planner against behaviour cloning and the data"
    write_measured(path, title, "results_table.py", note, columns, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--datasets",
        nargs="+",
        default=["pendulum-medium", "pendulum-medium-replay", "pendulum-medium-expert"],
        help="dataset configs, each optionally with its own seeds: NAME:0,1,2",
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="default seeds")
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--planner", default="default", help="planner preset to compare to bc")
    parser.add_argument("--out", type=Path, default=Path("outputs/results"))
    parser.add_argument("--train", nargs="*", default=[], help="extra tt-train overrides")
    parser.add_argument("--eval", nargs="*", default=[], help="extra tt-eval overrides")
    parser.add_argument(
        "--record",
        type=Path,
        help="also write the table as this results record (docs/results/records/<name>.json)",
    )
    args = parser.parse_args()
    ids: dict[str, str] = {}  # preset: Minari id, each checked before any training
    for spec in args.datasets:
        dataset = spec.partition(":")[0]
        try:
            ids[dataset] = dataset_id(dataset)
        except ValueError as error:
            parser.error(f"unknown dataset {dataset!r}: {error}")

    rows = []
    for spec in args.datasets:
        dataset, _, seed_list = spec.partition(":")
        seeds = [int(seed) for seed in seed_list.split(",")] if seed_list else args.seeds
        scores: dict[str, list[float]] = {args.planner: [], "bc": []}
        minutes = []
        for seed in seeds:
            checkpoint = train(dataset, seed, args.out / dataset / f"seed{seed}", args.train)
            results = {
                planner: evaluate(checkpoint, planner, args.episodes, args.eval)
                for planner in scores
            }
            for planner, summary in results.items():
                scores[planner].append(summary["normalized_score_mean"])
            evaluation_minutes = results[args.planner]["wall_seconds"] / 60
            minutes.append((training_minutes(checkpoint), evaluation_minutes))
        rows.append(
            (
                dataset,
                dataset_score(ids[dataset]),
                scores["bc"],
                scores[args.planner],
                seeds,
                minutes,
            )
        )
        summary = {"dataset": dataset, "seeds": seeds, "scores": scores, "minutes": minutes}
        (args.out / dataset / "scores.json").write_text(json.dumps(summary, indent=2) + "\n")

    def cell(values: list[float]) -> str:
        mean, stderr = mean_and_stderr(values)
        return f"{mean:.1f} ± {stderr:.1f}" if len(values) > 1 else f"{mean:.1f} (one seed)"

    def wall(minutes: list[tuple[float | None, float]]) -> str:
        trained = [train for train, _ in minutes if train is not None]
        training = f"{sum(trained) / len(trained):.0f}" if trained else "?"
        return f"{training} + {sum(plan for _, plan in minutes) / len(minutes):.0f}"

    columns = [
        "dataset",
        "dataset mean",
        "BC",
        f"planner ({args.planner})",
        "training seeds",
        "minutes per seed (training + planner evaluation)",
    ]
    cells = [
        [
            ids[dataset],
            f"{data_score:.1f}",
            cell(bc),
            cell(planned),
            ", ".join(map(str, seeds)),
            wall(minutes),
        ]
        for dataset, data_score, bc, planned, seeds, minutes in rows
    ]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    table = "\n".join(lines)
    note = (
        "\nNormalised scores (D4RL scale), mean ± standard error over training seeds, "
        f"{args.episodes} episodes per seed."
    )
    behaviours = [ids[row[0]] for row in rows if ids[row[0]] in BEHAVIOUR_SCORED]
    if behaviours:
        note += (
            f" Dataset mean of {', '.join(sorted(set(behaviours)))}: its behaviour policy's "
            "score in the evaluation env (its own episodes each end at a random goal)."
        )
    print(table + note)
    (args.out / "table.md").write_text(table + "\n" + note.strip() + "\n")
    print(f"per-seed scores: {args.out}/<dataset>/scores.json")
    if args.record is not None:
        write_record(args.record, columns, cells, note.strip())
        print(f"record: {args.record} (python scripts/render_results.py writes the pages)")


if __name__ == "__main__":
    main()
