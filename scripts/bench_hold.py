"""Time the plan calls of envs held at their goals: the search's own hold, and the best of
`planner.goal_tries` actions judged by the model's expected next position.

    python scripts/bench_hold.py --checkpoint pretrained:pointmaze/large-v0 \
        [--planner planner=maze-hold ...] [--tries 16 64] [--envs 10] [--reps 5] \
        [--record planning-cpu/<name>]

Each env is where one of the dataset's episodes ends (its final observation), its desired
goal set to where it is, so that every env is held, moving as the data moves there. An
untimed step gives each env one past transition, as in an episode; then the settings take
turns, one timed plan call (`act`, with `plan_every=1`) each, `--reps` rounds, so that a busy
machine slows them alike. Prints a table, one row per setting: the median milliseconds per
plan call and per env, and the ratio to the search alone.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import statistics
import subprocess
import time
from pathlib import Path

import trajectory_transformer  # first: sets the OpenMP wait before torch loads

# isort: split
import numpy as np
import torch
from render_results import RECORDS, write_measured

from trajectory_transformer.cli.common import planner_settings
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.planning import BeamPlanner

COLUMNS = ["hold", "ms per plan call", "ms per env", "against the search alone"]


def at_goal_observations(planner: BeamPlanner, envs: int) -> np.ndarray:
    """Observations (envs, O) held at their goals: the final observations of the planner's
    dataset's episodes, each desired goal set to the achieved one, the first `envs` that the
    planner holds (`BeamPlanner._at_goal`: a goal near the edge of the data's goals may fall
    in a bin away from its position)."""
    dataset_id = planner.dataset.dataset_id
    episodes, _ = load_episodes(dataset_id)
    if episodes.final_observations is None:
        raise SystemExit(f"{dataset_id} stores no final observations")
    goals = planner.goals
    observations = episodes.final_observations.copy()
    observations[:, goals.desired] = observations[:, goals.achieved]
    tokens = planner.discretizer.encode(
        torch.as_tensor(observations), slice(0, planner.observation_dim)
    )
    held = observations[planner._at_goal(tokens, planner.config.goal_radius).numpy()]
    if len(held) < envs:
        raise SystemExit(f"{dataset_id} has {len(held)} episode ends held, not {envs}")
    return held[:envs]


def library_version() -> str:
    """The library this run imported: its checkout's commit (and whether its files differ from
    it), else its installed version."""
    package = Path(trajectory_transformer.__file__).parent
    git = ["git", "-C", str(package)]
    found = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        return f"trajectory-transformer {importlib.metadata.version('trajectory-transformer')}"
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--", str(package)], capture_output=True, text=True
    ).stdout.strip()
    return f"the library of commit {found.stdout.strip()}" + (
        " with uncommitted changes" if changed else ""
    )


def timed_plans(planners: dict[str, BeamPlanner], observations: np.ndarray, reps: int) -> dict:
    """Milliseconds of each planner's plan calls (`reps` each, taking turns)."""
    zeros, running = np.zeros(len(observations)), np.zeros(len(observations), dtype=bool)
    for planner in planners.values():
        planner.reset(len(observations), seed=0)
        planner.act(observations)  # untimed: the past transition of the timed calls
        planner.observe(zeros, running)
    times: dict[str, list[float]] = {name: [] for name in planners}
    for _ in range(reps):
        for name, planner in planners.items():
            start = time.perf_counter()
            planner.act(observations)
            times[name].append(1000 * (time.perf_counter() - start))
            planner.observe(zeros, running)
    return times


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--checkpoint", required=True, help="a run dir, model.pt or pretrained:<dataset id>"
    )
    parser.add_argument(
        "--planner",
        nargs="*",
        default=["planner=maze-hold"],
        help="tt-eval planner overrides (with planner.goal_radius set)",
    )
    parser.add_argument("--tries", type=int, nargs="+", default=[16, 64])
    parser.add_argument("--envs", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    parser.add_argument("--record", help="write the table as this results record")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    overrides = [f"checkpoint={args.checkpoint}", *args.planner, "planner.plan_every=1"]
    planners = {}
    for tries in [None, *args.tries]:
        chosen = [] if tries is None else [f"planner.goal_tries={tries}"]
        settings = planner_settings([*overrides, *chosen])
        if settings["goal_radius"] is None:
            raise SystemExit("no hold to time: give planner.goal_radius (planner=maze-hold)")
        name = "the search's own" if tries is None else f"goal_tries={tries}"
        planners[name] = BeamPlanner.from_checkpoint(args.checkpoint, device="cpu", **settings)
    observations = at_goal_observations(next(iter(planners.values())), args.envs)
    times = timed_plans(planners, observations, args.reps)
    alone = statistics.median(times["the search's own"])
    rows = []
    for name, measured in times.items():
        ms = statistics.median(measured)
        rows.append([name, f"{ms:.0f}", f"{ms / args.envs:.1f}", f"{ms / alone:.2f}x"])
        print(" | ".join(rows[-1]), flush=True)
    if args.record:
        path = RECORDS / f"{args.record}.json"
        envs = f"{args.envs} envs, each" if args.envs > 1 else "1 env,"
        note = (
            f"{envs} at the final observation of one of the dataset's episodes with its goal set "
            f"there (held); medians of {args.reps} plan calls, the settings taking turns, "
            f"{args.threads} torch thread(s); {library_version()}"
        )
        title = "The plan calls of envs held at their goals"
        write_measured(path, title, Path(__file__).name, note, COLUMNS, rows)
        print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
