"""Why a goal-conditioned planner leaves its goal: what holding it would score, and how well the
model predicts the point's next position near the goal and away from it.

    python scripts/goal_holding.py \
        --search 'checkpoint=<run dir, model.pt or pretrained:<id>> planner=maze ...' \
        [--search '...' ...] [--episodes 20] [--record planner-scores/<name>]

Plays `--episodes` seeded evaluation episodes (seeds 0, 1, ... as tt-eval plays them, 10 envs
at a time) with each `--search`'s checkpoint and tt-eval planner overrides, and gives a row
for each: the model (its dataset, bins, value discount, seed and training steps), the search,
and the width of its position bins (the achieved goal's, mean over their dimensions), then
- the score, the episodes that reached the goal and the share of the steps after the first
  arrival spent within it, as tt-eval reports them;
- the score had every episode that reached the goal stayed there from its first arrival on:
  what holding alone would add;
- near the goal (within `--radius` of it) and away from it: how far the point really moves in
  one step, and how far the model's prediction of that step lands from where it went (the
  chosen plan's imagined next position, after the action the env then took). A search can
  keep the point at its goal only where this error is small beside the step itself. A plan
  of one transition (`planner=bc`) imagines no next position: those cells stay empty.

A critic's checkpoint with `planner=iql` plays its IQL policy (no model, no plan: the bin and
error cells stay empty), named by its dataset, its share of hindsight goals
(`critic.relabel_goals`), its seed and steps.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from render_results import RECORDS, write_measured

from trajectory_transformer.checkpoint import checkpoint_file, read_payload, value_targets_of
from trajectory_transformer.cli.common import planner_settings
from trajectory_transformer.critic import IQLAgent
from trajectory_transformer.critic.model import load_critic
from trajectory_transformer.data.goals import GoalLayout, continuing_rewards_of
from trajectory_transformer.evaluation.agent import PlanningAgent
from trajectory_transformer.evaluation.envs import make_vector_env
from trajectory_transformer.evaluation.loop import evaluate
from trajectory_transformer.planning import BeamPlanner
from trajectory_transformer.planning.waypoints import WaypointAgent
from trajectory_transformer.scores import normalized_score

COLUMNS = [
    "model",
    "search",
    "position bin",
    "score",
    "reached",
    "held",
    "score had it stayed",
    "step near the goal",
    "error near the goal",
    "step away from it",
    "error away from it",
]


class OneStepErrors:
    """An evaluation observer: for every env step that follows a new search, the real step's
    length and the distance from the chosen plan's imagined next position to the real one,
    each tagged by whether the step starts within `radius` of the goal."""

    def __init__(self, achieved: slice, desired: slice, radius: float):
        self.achieved, self.desired, self.radius = achieved, desired, radius
        self.predicted: dict[int, np.ndarray] = {}  # slot: imagined next position
        self.before: dict[int, np.ndarray] = {}  # slot: observation the search started from
        self.rows: list[tuple[bool, float, float]] = []  # (near, step, error)
        self._plan_seen = None

    def on_start(self, slot, episode, seed, observations, env) -> None:
        self.predicted.pop(slot, None)

    def on_act(self, agent, observations, actions, active) -> None:
        plan = agent.last_plan if isinstance(agent, PlanningAgent) else None
        if plan is None or plan is self._plan_seen:
            self.predicted.clear()  # an old plan followed: no fresh prediction this step
            return
        self._plan_seen = plan
        imagined = plan.observations[torch.arange(len(plan.best)), plan.best.cpu(), 1]
        imagined = imagined.cpu().numpy()[:, self.achieved]
        self.predicted = {
            slot: imagined[slot] for slot in np.flatnonzero(active) if bool(plan.active[slot])
        }
        self.before = {slot: np.asarray(observations[slot]) for slot in self.predicted}

    def on_step(self, observations, rewards, terminated, truncated, active, env) -> None:
        for slot, imagined in self.predicted.items():
            if terminated[slot] or truncated[slot]:
                continue  # the observation after an episode's last step is the next one's
            before, after = self.before[slot], np.asarray(observations[slot])
            near = np.linalg.norm(before[self.achieved] - before[self.desired]) <= self.radius
            step = np.linalg.norm(after[self.achieved] - before[self.achieved])
            self.rows.append(
                (bool(near), float(step), float(np.linalg.norm(imagined - after[self.achieved])))
            )

    def means(self, near: bool) -> tuple[float, float] | None:
        """Mean step length and prediction error of the steps near (or away from) the goal."""
        chosen = [(step, error) for at, step, error in self.rows if at == near]
        return tuple(np.mean(chosen, axis=0)) if chosen else None


def returns_had_it_stayed(
    returns: list[float], lengths: list[int], first: list[int | None], held: list[int]
) -> np.ndarray:
    """Each episode's return had it stayed at its goal from its first arrival on: every step
    from then to its end counted as held (`held` steps were; one return a step held)."""
    return np.array(
        [
            ret if at is None else ret + (length - at - steps)
            for ret, length, at, steps in zip(returns, lengths, first, held, strict=True)
        ],
        dtype=float,
    )


def model_name(planner: BeamPlanner, trained_steps: int | None) -> str:
    """The model as the table names it: its dataset, bins, value discount, share of windows
    relabelled with goals they reach (where there are any; "scaled" where their rewards past
    the goal were), training seed (where its
    checkpoint's config names it) and the steps it was trained for (where known: a training
    stopped early has fewer than it planned)."""
    bins = planner.discretizer.edges.shape[1] - 1
    discount, _ = value_targets_of(planner.training_config)
    name = f"{planner.dataset.dataset_id}, {bins} bins, discount {discount:g}"
    dataset = planner.training_config.get("dataset", {})
    if reached := dataset.get("relabel_reached"):
        name += f", relabel_reached {reached:g}"
        if continuing_rewards_of(dataset) == "scaled":
            name += " (scaled)"
    if (seed := planner.training_config.get("seed")) is not None:
        name += f", seed {seed}"
    if trained_steps is not None:
        name += f", {trained_steps:,} steps"
    return name


def critic_name(checkpoint: str) -> str:
    """A critic as the table names it: its dataset, its share of hindsight goals (where it has
    one), its seed and the steps it was trained for."""
    loaded = load_critic(checkpoint, "cpu")
    name = f"critic of {loaded.dataset.dataset_id}"
    if relabelled := loaded.config.get("critic", {}).get("relabel_goals"):
        name += f", relabel_goals {relabelled:g}"
    if (seed := loaded.config.get("seed")) is not None:
        name += f", seed {seed}"
    if (steps := (loaded.training or {}).get("step")) is not None:
        name += f", {steps:,} steps"
    return name


def position_bin(planner: BeamPlanner, achieved: slice) -> float:
    """The mean width of the bins of the position (the achieved goal's dimensions)."""
    edges = planner.discretizer.edges[achieved]
    return float((edges[:, -1] - edges[:, 0]).mean() / (edges.shape[1] - 1))


def planner_of(search: list[str]) -> tuple[str, list[str], dict, BeamPlanner | IQLAgent]:
    """One search's checkpoint, tt-eval planner overrides, the settings they compose to, and
    its planner on the CPU: `search` is `checkpoint=<...>` and those overrides."""
    given = [item for item in search if item.startswith("checkpoint=")]
    if len(given) != 1:
        raise SystemExit(f"each --search names one checkpoint=<...>; got {search}")
    checkpoint = given[0].partition("=")[2]
    overrides = [item for item in search if item not in given]
    settings = planner_settings([f"checkpoint={checkpoint}", *overrides])
    if settings.get("agent") != "iql":
        planner = BeamPlanner.from_checkpoint(checkpoint, device=torch.device("cpu"), **settings)
        return checkpoint, overrides, settings, planner  # heads for waypoints where set
    planner = IQLAgent.from_checkpoint(checkpoint, "cpu")
    if (lead := settings.get("waypoint_lead")) is not None:
        planner = WaypointAgent.of(planner, lead, settings["waypoint_cell"])
    return checkpoint, overrides, settings, planner


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """`--search` (repeated), `--episodes` and `--envs`, as every maze script reads them."""
    parser.add_argument(
        "--search",
        action="append",
        required=True,
        help="one row's checkpoint (a run dir, model.pt or pretrained:<dataset id>) and tt-eval "
        "planner overrides, quoted: 'checkpoint=pretrained:pointmaze/large-v0 planner=maze'",
    )
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--envs", type=int, default=10, help="envs stepped together")


def measure(search: list[str], episodes: int, radius: float, envs: int = 10) -> list[str]:
    """The row of one search: `checkpoint=<...>` and tt-eval's planner overrides."""
    checkpoint, overrides, settings, planner = planner_of(search)
    iql = settings.get("agent") == "iql"
    if iql:
        name, bin_width = critic_name(checkpoint), ""
    else:
        # The training state alone: the planner above has built the model already.
        trained_steps = (read_payload(checkpoint_file(checkpoint))["training"] or {}).get("step")
        name = model_name(planner, trained_steps)
    info = planner.dataset
    try:
        goals = GoalLayout.of(None if info is None else info.observation_layout)
    except ValueError as error:
        raise SystemExit(f"{checkpoint}: {error}") from None
    # A plan of one transition (behaviour cloning) imagines no next position: no error cells.
    planned_ahead = not iql and settings["horizon"] >= 2
    if not iql:
        bin_width = f"{position_bin(planner, goals.achieved):.3f}"
    errors = OneStepErrors(goals.achieved, goals.desired, radius)
    env = make_vector_env(info, min(envs, episodes))
    refs = (info.ref_min_score, info.ref_max_score)
    try:
        result = evaluate(
            planner,
            env,
            episodes,
            ref_scores=refs,
            progress=False,
            observers=[errors] if planned_ahead else [],
        )
    finally:
        env.close()
    if result.first_success_steps is None or result.normalized_scores is None:
        raise SystemExit(f"{checkpoint}: its env reports no success, or no reference scores")
    summary = result.summary()
    stayed = returns_had_it_stayed(
        result.returns, result.lengths, result.first_success_steps, result.success_steps
    )
    reached = sum(first is not None for first in result.first_success_steps)
    held = summary["stayed_fraction"]

    def cells(near: bool) -> list[str]:
        means = errors.means(near)
        return ["", ""] if means is None else [f"{means[0]:.3f}", f"{means[1]:.3f}"]

    return [
        name,
        ", ".join(f"`{override}`" for override in overrides),
        bin_width,
        f"{summary['normalized_score_mean']:.1f} ± {summary['normalized_score_stderr']:.1f}",
        f"{reached} of {episodes}",
        "" if held is None else f"{100 * held:.0f}%",
        f"{normalized_score(stayed, *refs).mean():.1f}",
        *cells(True),
        *cells(False),
    ]


def write_record(name: str, rows: list[list[str]], episodes: int, radius: float) -> Path:
    """The table as the results record `name` (docs/results/records/<name>.json)."""
    path = RECORDS / f"{name}.json"
    note = (
        f"normalised scores, mean ± standard error over {episodes} evaluation episodes; steps "
        f"and errors in the maze's units of position, near the goal meaning within {radius} "
        "of it"
    )
    title = "What holding the goal would score, and the model's step near it"
    write_measured(path, title, "goal_holding.py", note, COLUMNS, rows)
    return path


def main(argv: list[str] | None = None) -> list[list[str]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_search_arguments(parser)
    parser.add_argument("--radius", type=float, default=1.0, help="what counts as near the goal")
    parser.add_argument("--record", help="write the table as this results record")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # one thread, as tt-compare's jobs
    rows = []
    for search in args.search:
        rows.append(measure(search.split(), args.episodes, args.radius, args.envs))
        print(" | ".join(rows[-1]), flush=True)
    if args.record:
        print(f"wrote {write_record(args.record, rows, args.episodes, args.radius)}")
    return rows


if __name__ == "__main__":
    main()
