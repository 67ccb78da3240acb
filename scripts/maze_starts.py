"""How much do a maze evaluation's starts move its score?

    python scripts/maze_starts.py --episodes 20 --draws 6 [--no-reference] \
        --record goals/pointmaze-starts

A maze's normalised score runs from the uniform random policy (0) to the controller without
noise (100), each measured at the dataset's build over 50 reference episodes
(`collect.evaluation_seeds`). `tt-eval` plays other episodes, the seeds `eval.seed, eval.seed +
1, ...`, which place the point and the goal elsewhere: with 20 of them, how close the starts lie
to the goal moves every agent's score alike. For each maze, this plays the random policy, the
controller without noise and the behaviour policy (the controller with its noise) over
tt-eval's first `--episodes` seeds and over the reference episodes, the noisy policies over
`--draws` draws of their noise, and gives each one's mean return normalised by the dataset's
own reference scores: where 100 and the behaviour policy lie on the episodes a comparison
plays.
"""

from __future__ import annotations

import argparse

import numpy as np
from render_results import RECORDS, write_measured

from trajectory_transformer.scores import normalized_score
from trajectory_transformer.suites import collect, pointmaze

MAZES = ("umaze", "medium", "large")


def normalised_returns(maze: str, starts, draws: int) -> dict[str, float]:
    """Each policy's mean return over `starts` and `draws` noise draws, normalised."""
    low, high = pointmaze.reference_scores(maze)
    policies = {
        "random": pointmaze.uniform_random,
        "controller": pointmaze.WaypointController(pointmaze.MAZES[maze], 0.0),
        "behaviour": pointmaze.WaypointController(pointmaze.MAZES[maze], pointmaze.NOISE),
    }
    returns = [pointmaze.returns_from_starts(maze, policies, starts, s) for s in range(draws)]
    return {
        name: normalized_score(float(np.mean([r[name] for r in returns])), low, high)
        for name in returns[0]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=20, help="tt-eval's episodes (seeds 0...)")
    parser.add_argument("--draws", type=int, default=6, help="noise draws of the noisy policies")
    parser.add_argument("--mazes", nargs="+", default=list(MAZES), choices=MAZES)
    parser.add_argument(
        "--reference",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also play the reference episodes (--no-reference: tt-eval's alone)",
    )
    parser.add_argument("--record", help="write the table as this results record")
    args = parser.parse_args()
    columns = ["maze", "episodes", "random", "controller without noise", "behaviour policy"]
    rows = []
    for maze in args.mazes:
        starts = {f"tt-eval's seeds 0-{args.episodes - 1}": range(args.episodes)}
        if args.reference:
            reference = collect.evaluation_seeds(0, pointmaze.REFERENCE_EPISODES)
            starts[f"the reference's {pointmaze.REFERENCE_EPISODES}"] = reference
        for label, seeds in starts.items():
            scores = normalised_returns(maze, seeds, args.draws)
            rows.append([f"pointmaze/{maze}-v0", label, *(f"{s:.1f}" for s in scores.values())])
            print(" | ".join(rows[-1]), flush=True)
    if args.record:
        note = (
            f"normalised by each dataset's reference scores; the random and behaviour policies "
            f"over {args.draws} draws of their noise"
        )
        path = RECORDS / f"{args.record}.json"
        write_measured(
            path, "Where the starts put a maze's score", "maze_starts.py", note, columns, rows
        )
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
