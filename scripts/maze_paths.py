"""Where a maze agent's episodes go: every episode's path drawn on the maze, and where the ones
that never reach the goal end up.

    python scripts/maze_paths.py \
        --search 'checkpoint=<run dir, model.pt or pretrained:<id>> planner=maze-hold' \
        [--search '...' ...] [--episodes 20] [--figure docs/<name>.png] \
        [--record planner-scores/<name>]

Plays `--episodes` seeded evaluation episodes (seeds 0, 1, ... as tt-eval plays them, 10 envs
at a time) with each `--search`'s checkpoint and tt-eval planner overrides, and gives a row for
each: the score, the episodes that reached the goal, and of those that did not, how many ended
still (the point moved less than `--still` over the last `--window` steps: stuck, pressed
against a wall) and the maze cells they stopped in, each by its kind (a dead end, a corridor,
a corner or a junction, by its open neighbours). `--figure` draws one maze a search, each
episode's path on it: green where it reached the goal, red where it missed it, a cross where
a missed episode ended still.
"""

from __future__ import annotations

import argparse
import textwrap
from collections import Counter
from pathlib import Path

import matplotlib
import numpy as np
import torch
from goal_holding import add_search_arguments, model_name, planner_of
from matplotlib.figure import Figure
from render_results import RECORDS, write_measured

from trajectory_transformer.checkpoint import checkpoint_file, read_payload
from trajectory_transformer.evaluation.envs import make_vector_env
from trajectory_transformer.evaluation.loop import evaluate
from trajectory_transformer.planning import BeamPlanner
from trajectory_transformer.viz import draw_maze_walls, maze_of

matplotlib.use("Agg")

COLUMNS = [
    "model",
    "search",
    "score",
    "reached",
    "missed, ended still",
    "the cells they ended in, by kind",
    "cells they stopped in (row, column: episodes)",
    "missed, still moving",
]
GOAL_RADIUS = 0.45  # gymnasium-robotics' PointMaze: within it, a step is at the goal


class Paths:
    """An evaluation observer: each episode's positions (its seed's), `point` of the
    flattened observation, and its goal."""

    def __init__(self, point: slice, goal: slice):
        self.point, self.goal = point, goal
        self.playing: dict[int, tuple[int, list[np.ndarray]]] = {}  # slot: (seed, positions)
        self.goals: dict[int, np.ndarray] = {}  # seed: its goal
        self.finished: dict[int, np.ndarray] = {}  # seed: positions (steps + 1, 2)

    def on_start(self, slot, episode, seed, observations, env) -> None:
        self._finish(slot)
        self.playing[slot] = (seed, [np.array(observations[slot][self.point])])
        self.goals[seed] = np.array(observations[slot][self.goal])

    def on_act(self, agent, observations, actions, active) -> None:
        pass

    def on_step(self, observations, rewards, terminated, truncated, active, env) -> None:
        for slot in np.flatnonzero(active):
            # The observation after an episode's last step is the next one's first.
            if slot in self.playing and not (terminated[slot] or truncated[slot]):
                self.playing[slot][1].append(np.array(observations[slot][self.point]))

    def close(self) -> None:
        for slot in list(self.playing):
            self._finish(slot)

    def _finish(self, slot: int) -> None:
        if slot in self.playing:
            seed, positions = self.playing.pop(slot)
            self.finished[seed] = np.stack(positions)


def cell_of(position: np.ndarray, rows: int, columns: int) -> tuple[int, int]:
    """The maze map's (row, column) of an (x, y) position, in gymnasium-robotics' coordinates:
    unit cells, centred on the origin, row 0 at the top."""
    return int(np.floor(rows / 2 - position[1])), int(np.floor(position[0] + columns / 2))


def cell_kind(maze_map: list[list], cell: tuple[int, int]) -> str:
    """An open cell by its open neighbours: a dead end (one), a corridor (two, opposite), a
    corner (two, at a right angle) or a junction (three or more)."""
    rows, columns = len(maze_map), len(maze_map[0])
    r, c = cell
    steps = [(dr, dc) for dr, dc in ((1, 0), (-1, 0), (0, 1), (0, -1))]
    open_ = [
        (dr, dc)
        for dr, dc in steps
        if 0 <= r + dr < rows and 0 <= c + dc < columns and maze_map[r + dr][c + dc] != 1
    ]
    if len(open_) <= 1:
        return "dead end"
    if len(open_) == 2:
        (a, b), (x, y) = open_
        return "corridor" if (a + x, b + y) == (0, 0) else "corner"
    return "junction"


def play(search: list[str], episodes: int, envs: int) -> tuple[BeamPlanner, Paths, dict]:
    """Play `episodes` with one search (`checkpoint=<...>` and tt-eval's planner overrides):
    its planner, every episode's path, and tt-eval's summary."""
    checkpoint, _, _, planner = planner_of(search)
    info = planner.dataset
    maze = None if info is None else maze_of(info)
    if maze is None or maze[2] is None:
        raise SystemExit(f"{checkpoint}: not a maze with its goal in the observation")
    paths = Paths(maze[1], maze[2])
    env = make_vector_env(info, min(envs, episodes))
    try:
        result = evaluate(
            planner,
            env,
            episodes,
            ref_scores=(info.ref_min_score, info.ref_max_score),
            progress=False,
            observers=[paths],
        )
    finally:
        env.close()
    paths.close()
    return planner, paths, result.summary()


def reached_goal(positions: np.ndarray, goal: np.ndarray) -> bool:
    """Whether any position came within the goal's radius."""
    return bool((np.linalg.norm(positions - goal, axis=1) <= GOAL_RADIUS).any())


def ended_still(positions: np.ndarray, window: int, still: float) -> bool:
    """Whether the point moved less than `still` over the last `window` steps."""
    last = positions[-(window + 1) :]
    return bool(np.linalg.norm(last - last[-1], axis=1).max() < still)


def outcomes(
    paths: Paths, maze_map: list[list], window: int, still: float
) -> tuple[int, int, int, Counter]:
    """The episodes that reached their goal, missed it ending still, and missed it still
    moving; and the cells (row, column) the still ones ended in, with their counts."""
    rows, columns = len(maze_map), len(maze_map[0])
    reached = still_ends = moving = 0
    stopped: Counter[tuple[int, int]] = Counter()
    for seed, positions in paths.finished.items():
        if reached_goal(positions, paths.goals[seed]):
            reached += 1
        elif ended_still(positions, window, still):
            still_ends += 1
            stopped[cell_of(positions[-1], rows, columns)] += 1
        else:
            moving += 1
    return reached, still_ends, moving, stopped


def row_of(
    search: list[str], planner: BeamPlanner, paths: Paths, summary: dict, window: int, still: float
) -> list[str]:
    maze_map = maze_of(planner.dataset)[0]
    reached, still_ends, moving, stopped = outcomes(paths, maze_map, window, still)
    kinds: Counter[str] = Counter()
    for cell, n in stopped.items():
        kinds[cell_kind(maze_map, cell)] += n
    checkpoint = next(item for item in search if item.startswith("checkpoint="))
    trained = read_payload(checkpoint_file(checkpoint.partition("=")[2]))["training"] or {}
    return [
        model_name(planner, trained.get("step")),
        ", ".join(f"`{item}`" for item in search if item != checkpoint),
        f"{summary['normalized_score_mean']:.1f} ± {summary['normalized_score_stderr']:.1f}",
        f"{reached} of {len(paths.finished)}",
        str(still_ends),
        ", ".join(f"{kind}: {n}" for kind, n in sorted(kinds.items())),
        ", ".join(f"({r}, {c}): {n}" for (r, c), n in sorted(stopped.items())),
        str(moving),
    ]


def draw(played: list[tuple[str, BeamPlanner, Paths]], window: int, still: float) -> Figure:
    """One maze a search: every episode's path, green where it reached the goal, red where
    not, a cross where a missed episode ended still; the goals as stars."""
    maze_map = maze_of(played[0][1].dataset)[0]
    rows, columns = len(maze_map), len(maze_map[0])
    fig = Figure(
        figsize=(0.45 * columns * len(played) + 0.5, 0.45 * rows + 1.2), layout="constrained"
    )
    axes = np.atleast_1d(fig.subplots(1, len(played)))
    for ax, (title, _, paths) in zip(axes, played, strict=True):
        draw_maze_walls(ax, maze_map)
        for seed, positions in sorted(paths.finished.items()):
            goal = paths.goals[seed]
            hit = reached_goal(positions, goal)
            colour = "tab:green" if hit else "tab:red"
            ax.plot(positions[:, 0], positions[:, 1], color=colour, lw=0.8, alpha=0.7)
            ax.plot(*positions[0], "o", color=colour, ms=3)
            if not hit and ended_still(positions, window, still):
                ax.plot(*positions[-1], "x", color="black", ms=7, mew=1.5)
            ax.plot(*goal, "*", color="gold", mec="black", ms=11)
        ax.set_title(title, fontsize=8)
        ax.set_xticks([])
        ax.set_yticks([])
    return fig


def write_record(name: str, rows: list[list[str]], args: argparse.Namespace) -> Path:
    """The table as the results record `name` (docs/results/records/<name>.json)."""
    path = RECORDS / f"{name}.json"
    note = (
        f"normalised scores, mean ± standard error over {args.episodes} evaluation episodes; "
        f"an episode missed its goal if it never came within {GOAL_RADIUS} of it, and ended "
        f"still if the point moved less than {args.still} over its last {args.window} steps; "
        "a cell is a dead end, a corridor, a corner or a junction by its open neighbours "
        "(one; two opposite; two at a right angle; three or more), its row and column those "
        "of the maze map"
    )
    title = "Where the episodes that miss the goal end"
    write_measured(path, title, "maze_paths.py", note, COLUMNS, rows)
    return path


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_search_arguments(parser)
    parser.add_argument("--window", type=int, default=100, help="the last steps judged still")
    parser.add_argument("--still", type=float, default=0.1, help="the most a still point moves")
    parser.add_argument("--figure", help="draw every search's paths into this image")
    parser.add_argument("--record", help="write the table as this results record")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread, as tt-compare's jobs
    rows, played = [], []
    for search in args.search:
        items = search.split()
        planner, paths, summary = play(items, args.episodes, args.envs)
        rows.append(row_of(items, planner, paths, summary, args.window, args.still))
        title = textwrap.fill(f"{rows[-1][0]}; {rows[-1][1].replace('`', '')}", 48)
        played.append((title, planner, paths))
        print(" | ".join(rows[-1]), flush=True)
    if args.figure:
        draw(played, args.window, args.still).savefig(args.figure, dpi=110)
        print(f"wrote {args.figure}")
    if args.record:
        print(f"wrote {write_record(args.record, rows, args)}")
    return rows


if __name__ == "__main__":
    main()
