"""Figures of plans, episodes, model diagnostics and comparisons of agents (matplotlib).

Every function returns a `matplotlib.figure.Figure` without touching pyplot's global state,
so figures display in a notebook as the cell's value and save with `fig.savefig(path)`.
`save_episode_figures` writes the figures of a recorded episode as PNG files; `tt-eval
eval.save_plots=true` calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import gymnasium as gym
import matplotlib
import numpy as np
import torch
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from trajectory_transformer.comparison.statistics import performance_profile
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.episodes import DISCOUNT, TERMINAL_PENALTY
from trajectory_transformer.data.minari_source import DatasetInfo, observation_columns
from trajectory_transformer.diagnostics import (
    CompoundingError,
    PlanDistributions,
    TokenAccuracy,
    dimension_names,
    plan_distributions,
    value_targets_of,
)
from trajectory_transformer.evaluation.record import EpisodeRecord, PlanSnapshot
from trajectory_transformer.model.gpt import trajectory_attention_mask
from trajectory_transformer.planning.beam import BeamPlanner

BEAM_COLOUR = "0.6"
CHOSEN_COLOUR = "tab:red"
REAL_COLOUR = "black"


def _grid(panels: int, columns: int = 4, size: tuple[float, float] = (3.2, 2.4)):
    columns = min(columns, panels)
    rows = -(-panels // columns)
    fig = Figure(figsize=(size[0] * columns, size[1] * rows + 0.6), layout="constrained")
    axes = fig.subplots(rows, columns, squeeze=False).reshape(-1)
    for ax in axes[panels:]:
        ax.set_visible(False)
    return fig, axes[:panels]


def plot_plan_beams(
    snapshot: PlanSnapshot,
    record: EpisodeRecord | None = None,
    names: Sequence[str] | None = None,
) -> Figure:
    """Every beam's planned observations and actions over the horizon, the chosen plan
    highlighted, and what the episode then actually did (from `record`)."""
    plan = snapshot.plan
    observations, actions = plan.observations[0].numpy(), plan.beam_actions[0].numpy()
    B, H, O = observations.shape  # noqa: E741
    A = actions.shape[-1]
    names = list(names) if names is not None else dimension_names(O, A)
    steps = snapshot.step + np.arange(H)
    executed_obs = executed_act = None
    if record is not None:
        executed_obs = np.asarray(record.observations[snapshot.step : snapshot.step + H])
        executed_act = np.asarray(record.actions[snapshot.step : snapshot.step + H])
    fig, axes = _grid(O + A)
    for d, ax in enumerate(axes):
        planned = observations[..., d] if d < O else actions[..., d - O]  # (B, H)
        executed = executed_obs if d < O else executed_act
        column = d if d < O else d - O
        ax.plot(steps, planned.T, color=BEAM_COLOUR, lw=0.8, alpha=0.5)
        ax.plot([], [], color=BEAM_COLOUR, lw=0.8, label=f"{B} beams")
        ax.plot(steps, planned[snapshot.best], color=CHOSEN_COLOUR, lw=2, label="chosen plan")
        if executed is not None and len(executed):
            ax.plot(
                steps[: len(executed)],
                executed[:, column],
                color=REAL_COLOUR,
                ls="--",
                marker="o",
                ms=3,
                label="executed",
            )
        kind = "observation" if d < O else "action"
        ax.set_title(f"{kind}: {names[d]}", fontsize=10)
        ax.set_xlabel("env step")
        ax.set_ylabel(names[d])
    axes[0].legend(fontsize=8)
    fig.suptitle(
        f"Plans made at step {snapshot.step}: {B} beams over {H} transitions "
        "(planned values are decoded tokens)"
    )
    return fig


def _heat_map(ax, steps: np.ndarray, edges: np.ndarray, probs: np.ndarray, fig: Figure):
    x = np.append(steps - 0.5, steps[-1] + 0.5)
    mesh = ax.pcolormesh(x, edges, probs.T, cmap="viridis", shading="flat")
    fig.colorbar(mesh, ax=ax, label="probability of the bin")


def plot_plan_predictions(
    snapshot: PlanSnapshot,
    distributions: PlanDistributions,
    discretizer: Discretizer,
    record: EpisodeRecord | None = None,
    discount: float = DISCOUNT,
    terminal_penalty: float = TERMINAL_PENALTY,
) -> Figure:
    """Predicted reward and value along the chosen plan (per-bin probabilities as a heat
    map, and the expectation the score used) against the real rewards and returns-to-go."""
    plan, best = snapshot.plan, snapshot.best
    H = plan.rewards.shape[-1]
    T = discretizer.dims
    steps = snapshot.step + np.arange(H)
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    axes = fig.subplots(1, 2)
    real = {}
    if record is not None:
        window = slice(snapshot.step, snapshot.step + H)
        real["reward"] = record.reward_targets(terminal_penalty)[window]
        real["value"] = record.value_targets(discount, terminal_penalty)[window]
    panels = (
        ("reward", T - 2, distributions.rewards, plan.rewards[0, best].numpy()),
        ("value", T - 1, distributions.values, plan.values[0, best].numpy()),
    )
    for ax, (name, dim, probs, expected) in zip(axes, panels, strict=True):
        edges = discretizer.edges[dim].cpu().numpy()
        _heat_map(ax, steps, edges, probs, fig)
        ax.plot(steps, expected, color=CHOSEN_COLOUR, marker="o", lw=2, label="predicted (used)")
        if name in real and len(real[name]):
            truth = real[name]
            ax.plot(steps[: len(truth)], truth, color="white", marker="s", ls="--", label="real")
        low, high = _interesting_range(edges, probs, expected, real.get(name))
        ax.set_ylim(low, high)
        outside = probs[:, (edges[1:] <= low) | (edges[:-1] >= high)].sum(axis=1).max()
        if outside > 0.005:  # a far tail moves the expectation; say so, since it is off-plot
            ax.text(
                0.02,
                0.02,
                f"up to {outside:.0%} of the probability\nlies outside this range",
                transform=ax.transAxes,
                color="white",
                fontsize=8,
            )
        ax.set_xlabel("env step")
        label = "reward" if name == "reward" else f"return-to-go (discount {discount})"
        ax.set_ylabel(label)
        ax.set_title(f"{name}: predicted distribution vs real", fontsize=10)
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle(f"Chosen plan at step {snapshot.step}: what the model expected")
    return fig


def _interesting_range(edges, probs, expected, truth) -> tuple[float, float]:
    """Vertical range covering the bins with visible probability, the expectation and the
    real values, so a wide bin grid does not squash the plot."""
    visible = np.flatnonzero(probs.max(axis=0) > 0.01 * probs.max())
    values = [edges[visible.min()], edges[visible.max() + 1], *expected]
    if truth is not None and len(truth):
        values += list(truth)
    low, high = float(np.min(values)), float(np.max(values))
    pad = 0.05 * (high - low or 1.0)
    return low - pad, high + pad


def plot_beam_scores(snapshot: PlanSnapshot) -> Figure:
    """The score of every final beam, best first, the chosen one highlighted."""
    scores = snapshot.plan.scores[0].numpy()
    order = np.argsort(-scores)
    rank_of_chosen = int(np.flatnonzero(order == snapshot.best)[0])
    fig = Figure(figsize=(7, 3.4), layout="constrained")
    ax = fig.subplots()
    ranks = np.arange(len(scores))
    ax.plot(ranks, scores[order], "o", color=BEAM_COLOUR, ms=4, label="beams")
    ax.plot(rank_of_chosen, scores[snapshot.best], "o", color=CHOSEN_COLOUR, ms=8, label="chosen")
    ax.set_xlabel("beam, sorted by score")
    ax.set_ylabel("score = Σ γ^h r_h + γ^H V")
    ax.set_title(f"Beam scores of the plan made at step {snapshot.step}")
    ax.legend(fontsize=8)
    return fig


def plot_frames(
    planned: Sequence[np.ndarray] | None, executed: Sequence[np.ndarray], step: int
) -> Figure:
    """Frames of the chosen plan (top; None where the env cannot show imagined states) next
    to frames of what happened (bottom), one column per step."""
    columns = len(executed) if planned is None else max(len(planned), len(executed))
    fig = Figure(figsize=(1.9 * columns, 4.2), layout="constrained")
    axes = fig.subplots(2, columns, squeeze=False)
    for row, (frames, label) in enumerate(((planned, "imagined"), (executed, "executed"))):
        for col in range(columns):
            ax = axes[row, col]
            ax.set_xticks([])
            ax.set_yticks([])
            if frames is not None and col < len(frames):
                ax.imshow(frames[col])
            else:
                ax.set_facecolor("0.9")
            if row == 0:
                ax.set_title(f"step {step + col}", fontsize=9)
            if col == 0:
                ax.set_ylabel(label)
    if planned is None:
        axes[0, 0].text(0.05, 0.5, "this env cannot\nrender imagined\nstates", fontsize=8)
    fig.suptitle(f"The chosen plan at step {step} (top) and what happened (bottom)")
    return fig


def plot_episode_predictions(
    record: EpisodeRecord, discount: float = DISCOUNT, terminal_penalty: float = TERMINAL_PENALTY
) -> Figure:
    """Over the whole episode: the reward and value the chosen plan predicted for its first
    transition at every replanning step, against the real reward and return-to-go."""
    steps = np.arange(len(record))
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (
        ("reward", record.predicted_rewards, record.reward_targets(terminal_penalty)),
        ("return-to-go", record.predicted_values, record.value_targets(discount, terminal_penalty)),
    )
    for ax, (name, predicted, real) in zip(axes, panels, strict=True):
        ax.plot(steps, real, color=REAL_COLOUR, lw=1.5, label="real")
        ax.plot(steps, predicted, color=CHOSEN_COLOUR, lw=1, marker=".", ms=3, label="predicted")
        ax.set_xlabel("env step")
        ax.set_ylabel(name if name == "reward" else f"{name} (discount {discount})")
        ax.set_title(f"{name}: first transition of each plan vs real", fontsize=10)
        ax.legend(fontsize=8)
    total = float(np.sum(record.rewards))
    fig.suptitle(f"Episode (seed {record.seed}): {len(record)} steps, return {total:.1f}")
    return fig


def plot_token_accuracy(
    accuracy: TokenAccuracy, reconstruction_error: np.ndarray, names: Sequence[str]
) -> Figure:
    """Per transition dimension: next-token accuracy of the model (teacher-forced) and the
    discretizer's round-trip error."""
    x = np.arange(len(names))
    fig = Figure(figsize=(max(7.0, 0.55 * len(names) + 2), 6), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True)
    width = 0.4
    top.bar(x - width / 2, 100 * accuracy.top1, width, label="exact bin")
    top.bar(x + width / 2, 100 * accuracy.within_one, width, label="within one bin")
    top.set_ylabel("accuracy (%)")
    top.set_ylim(0, 100)
    top.set_title(f"Next-token accuracy per dimension ({accuracy.tokens:,} tokens each)")
    top.legend(fontsize=8)
    bottom.bar(x, 100 * np.asarray(reconstruction_error), color="tab:purple")
    bottom.set_ylabel("mean |x - decode(encode(x))|\n(% of the dimension's range)")
    bottom.set_title("Discretizer round-trip error per dimension")
    bottom.set_xticks(x, names, rotation=45, ha="right")
    for ax in (top, bottom):
        ax.set_xlabel("transition dimension")
    return fig


def plot_attention(
    maps: torch.Tensor, names: Sequence[str], layers: Sequence[int] | None = None
) -> Figure:
    """Attention maps (layers, heads, S, S) of one sequence, query rows and key columns, with
    transition boundaries drawn. Entries the attention mask hides are grey: the future, and
    the value tokens of earlier transitions (the grey columns below the diagonal)."""
    T = len(names)
    layers = list(range(maps.shape[0])) if layers is None else list(layers)
    heads, S = maps.shape[1], maps.shape[-1]
    fig = Figure(figsize=(3.3 * heads, 3.2 * len(layers) + 0.5), layout="constrained")
    axes = fig.subplots(len(layers), heads, squeeze=False)
    ticks = np.arange(0, S, T)
    value_keys = np.arange(T - 1, S, T)
    hidden = ~trajectory_attention_mask(S, T).numpy()  # drawn grey: the mask, not a choice
    cmap = matplotlib.colormaps["magma"].with_extremes(bad="0.8")
    for row, layer in enumerate(layers):
        for head in range(heads):
            ax = axes[row, head]
            probs = np.ma.masked_where(hidden, maps[layer, head].numpy())
            image = ax.imshow(probs, cmap=cmap, vmin=0, vmax=1)
            for boundary in ticks[1:]:
                ax.axhline(boundary - 0.5, color="white", lw=0.3)
                ax.axvline(boundary - 0.5, color="white", lw=0.3)
            ax.plot(value_keys, np.full_like(value_keys, -1.2), "v", color="tab:cyan", ms=3)
            ax.set_ylim(S - 0.5, -2)
            ax.set_title(f"layer {layer}, head {head}", fontsize=9)
            ax.set_xticks(ticks, [f"t{i}" for i in range(len(ticks))], fontsize=7)
            ax.set_yticks(ticks, [f"t{i}" for i in range(len(ticks))], fontsize=7)
            if head == 0:
                ax.set_ylabel("query (transition)")
            if row == len(layers) - 1:
                ax.set_xlabel("key (transition)")
    fig.colorbar(image, ax=axes, label="attention probability", shrink=0.8)
    fig.suptitle(
        f"Attention over {S // T} transitions of {T} tokens (grey: masked; ▼ value tokens, "
        "hidden from later tokens)"
    )
    return fig


def plot_compounding_error(error: CompoundingError) -> Figure:
    """Prediction error against planning depth: imagined (open loop) versus one-step."""
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    obs_ax, reward_ax = fig.subplots(1, 2)
    panels = (
        (obs_ax, error.imagined_observation, error.one_step_observation, "observation"),
        (reward_ax, error.imagined_reward, error.one_step_reward, "reward"),
    )
    for ax, imagined, one_step, name in panels:
        ax.plot(
            error.depth,
            imagined,
            marker="o",
            color=CHOSEN_COLOUR,
            label="imagined since the context",
        )
        ax.plot(error.depth, one_step, marker="s", color=REAL_COLOUR, label="one step (true past)")
        ax.set_xlabel("depth (transitions after the real context)")
        unit = "(data standard deviations)" if name == "observation" else "(reward units)"
        ax.set_ylabel(f"mean |{name} error| {unit}")
        ax.set_title(f"{name} prediction error vs planning depth", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.suptitle("Compounding error: the model imagining its own future, true actions fed")
    return fig


def maze_of(dataset: DatasetInfo) -> tuple[list[list], slice, slice | None] | None:
    """(maze map, the point's x-y dimensions, the goal's) of a dataset whose evaluation env is
    a gymnasium-robotics maze (PointMaze, AntMaze: a `maze_map` in its spec), read from the
    checkpoint's env spec and observation layout; None for any other env."""
    if dataset.eval_env_spec is None:
        return None
    spec = gym.envs.registration.EnvSpec.from_json(dataset.eval_env_spec)
    maze_map = spec.kwargs.get("maze_map")
    if maze_map is None or dataset.observation_layout is None:
        return None
    columns = observation_columns(dataset.observation_layout)
    point = columns.get("achieved_goal", columns.get("observation", slice(0, 2))).start
    goal = columns["desired_goal"].start if "desired_goal" in columns else None
    return maze_map, slice(point, point + 2), None if goal is None else slice(goal, goal + 2)


def draw_maze_walls(ax: Axes, maze_map: list[list]) -> tuple[float, float, float, float]:
    """Draw a gymnasium-robotics maze's walls (cells of 1, grey) on `ax`, in the env's own
    coordinates: the maze centred on the origin, one unit a cell, row 0 at the top. Returns the
    extent (left, right, bottom, top)."""
    walls = np.array([[cell == 1 for cell in row] for row in maze_map], dtype=float)
    rows, columns = walls.shape
    extent = (-columns / 2, columns / 2, -rows / 2, rows / 2)
    ax.imshow(walls, cmap="Greys", vmin=0, vmax=1.6, extent=extent, origin="upper")
    return extent


def plot_maze_plans(
    record: EpisodeRecord,
    dataset: DatasetInfo,
    steps: Sequence[int] | None = None,
    planner: BeamPlanner | None = None,
) -> Figure:
    """A maze episode seen from above: the walls, the beams of the searches kept at `steps`
    (default: every kept one) as the positions they imagined (thin; the chosen plan thick, one
    colour per search), the path actually taken (black, from the start's circle) and the goal
    (star). A plan's first position is the real one it started from. Given the `planner` that
    played the episode, where it heads for waypoints (`planner.waypoint_lead`), each kept
    search's waypoint is a cross in its colour: the goal that search planned toward."""
    maze = maze_of(dataset)
    if maze is None:
        raise ValueError(
            f"{dataset.dataset_id} is not a maze: its evaluation env has no maze_map, or its "
            "observations are not a Dict with the point's position"
        )
    maze_map, point, goal = maze
    rows, columns = len(maze_map), len(maze_map[0])
    fig = Figure(figsize=(0.9 * columns + 2.5, 0.9 * rows + 0.8), layout="constrained")
    ax = fig.subplots()
    extent = draw_maze_walls(ax, maze_map)
    kept = sorted(record.plans) if steps is None else [s for s in steps if s in record.plans]
    colours = matplotlib.colormaps["viridis"](np.linspace(0.1, 0.9, max(len(kept), 1)))
    for colour, step in zip(colours, kept, strict=False):
        snapshot = record.plans[step]
        beams = snapshot.plan.observations[0][..., point].numpy()  # (B, H, 2)
        for beam in beams:
            ax.plot(beam[:, 0], beam[:, 1], color=colour, lw=0.6, alpha=0.35)
        chosen = beams[snapshot.best]
        ax.plot(chosen[:, 0], chosen[:, 1], color=colour, lw=2.2, label=f"plans at step {step}")
        if planner is not None and planner.waypoints is not None:
            observation, goals = np.asarray(record.observations[step]), planner.goals
            position, desired = observation[goals.achieved], observation[goals.desired]
            waypoint = planner.waypoints.waypoint(position, desired, planner.config.waypoint_lead)
            ax.plot(*waypoint, "X", color=colour, ms=9, mec="black", label=f"waypoint at {step}")
    path = np.asarray(record.observations)[:, point]
    ax.plot(path[:, 0], path[:, 1], color=REAL_COLOUR, lw=1.4, label="path taken")
    ax.plot(*path[0], "o", color=REAL_COLOUR, ms=7, mfc="white", label="start")
    # The positions after rewarded steps: in a maze, the steps that ended at the goal.
    rewarded_steps = np.flatnonzero(np.asarray(record.rewards) > 0)
    rewarded = rewarded_steps[rewarded_steps + 1 < len(path)]
    if len(rewarded):
        at_goal = path[rewarded + 1]
        ax.plot(at_goal[:, 0], at_goal[:, 1], ".", color=CHOSEN_COLOUR, ms=4, label="at the goal")
    if goal is not None:
        ax.plot(
            *np.asarray(record.observations)[0, goal], "*", color=CHOSEN_COLOUR, ms=16, label="goal"
        )
    ax.set_xlim(extent[0], extent[1])
    ax.set_ylim(extent[2], extent[3])
    ax.set_aspect("equal")
    ax.set_xlabel("x")
    ax.set_ylabel("y")
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(
        f"{dataset.dataset_id}: {len(record)} steps, return {sum(record.rewards):.0f} "
        f"({len(rewarded_steps)} rewarded)",
        fontsize=10,
    )
    return fig


def save_episode_figures(
    record: EpisodeRecord,
    planner: BeamPlanner,
    directory: str | Path,
    names: Sequence[str] | None = None,
    discount: float | None = None,
    terminal_penalty: float | None = None,
) -> list[Path]:
    """Write the figures of a recorded episode as PNG files into `directory`:
    `episode_predictions.png`, per kept plan `plan_step<t>_{beams,predictions,scores}.png`,
    and for a maze `maze_plans.png` (every kept plan over the maze, and the path taken).

    `discount` and `terminal_penalty` default to the ones the planner's checkpoint was trained
    with (the value tokens' targets)."""
    trained_discount, trained_penalty = value_targets_of(planner.training_config)
    discount = trained_discount if discount is None else discount
    terminal_penalty = trained_penalty if terminal_penalty is None else terminal_penalty
    if names is None:
        env_id = planner.dataset.eval_env_id if planner.dataset is not None else None
        names = dimension_names(planner.observation_dim, planner.action_dim, env_id)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    figures = {"episode_predictions": plot_episode_predictions(record, discount, terminal_penalty)}
    for step, snapshot in sorted(record.plans.items()):
        distributions = plan_distributions(planner.model, snapshot, planner.config.temperature)
        figures[f"plan_step{step}_beams"] = plot_plan_beams(snapshot, record, names)
        figures[f"plan_step{step}_predictions"] = plot_plan_predictions(
            snapshot, distributions, planner.discretizer, record, discount, terminal_penalty
        )
        figures[f"plan_step{step}_scores"] = plot_beam_scores(snapshot)
    if planner.dataset is not None and maze_of(planner.dataset) is not None:
        figures["maze_plans"] = plot_maze_plans(record, planner.dataset, planner=planner)
    paths = []
    for name, fig in figures.items():
        paths.append(directory / f"{name}.png")
        fig.savefig(paths[-1], dpi=110)
    return paths


# --- comparisons of agents (tt-compare) ---------------------------------------------------


def plot_comparison_scores(
    values: dict[str, np.ndarray], decisions: Sequence[dict], unit: str = "normalised score"
) -> Figure:
    """Each agent's scores over training seeds (a box and every seed), and the decisions."""
    names = list(values)
    fig = Figure(figsize=(1.6 * len(names) + 3.5, 4.2), layout="constrained")
    ax = fig.subplots()
    ax.boxplot([values[name] for name in names], showfliers=False)
    ax.set_xticks(range(1, len(names) + 1), names)
    for position, name in enumerate(names, start=1):
        jitter = np.linspace(-0.12, 0.12, len(values[name])) if len(values[name]) > 1 else [0.0]
        ax.plot(position + np.asarray(jitter), values[name], "o", color=BEAM_COLOUR, ms=4)
    ax.set_ylabel(f"{unit} per training seed")
    ax.set_xlabel("agent")
    lines = [
        f"{row['comparison']}: {row['decision']} "
        f"({row['interims']} interim{'' if row['interims'] == 1 else 's'})"
        for row in decisions
    ]
    ax.set_title("AdaStop decisions\n" + "\n".join(lines), fontsize=9)
    return fig


def plot_iqm_intervals(
    names: Sequence[str],
    iqms: Sequence[float],
    intervals: Sequence[tuple[float, float]],
    unit: str = "normalised score",
) -> Figure:
    """Interquartile mean of each agent with its 95% bootstrap interval over seeds."""
    fig = Figure(figsize=(6.5, 0.6 * len(names) + 1.6), layout="constrained")
    ax = fig.subplots()
    rows = np.arange(len(names))
    low = np.asarray(iqms) - np.asarray([i[0] for i in intervals])
    high = np.asarray([i[1] for i in intervals]) - np.asarray(iqms)
    ax.errorbar(iqms, rows, xerr=[low, high], fmt="o", color=CHOSEN_COLOUR, capsize=4)
    ax.set_yticks(rows, names)
    ax.set_xlabel(f"IQM of the {unit} (95% stratified bootstrap interval)")
    ax.set_title("Interquartile mean over training seeds", fontsize=10)
    return fig


def plot_performance_profile(
    values: dict[str, np.ndarray], unit: str = "normalised score"
) -> Figure:
    """Fraction of an agent's seeds scoring above each threshold."""
    everything = np.concatenate([np.asarray(v, dtype=float) for v in values.values()])
    span = everything.max() - everything.min() or 1.0
    thresholds = np.linspace(everything.min() - 0.05 * span, everything.max() + 0.05 * span, 200)
    fig = Figure(figsize=(6.5, 4.0), layout="constrained")
    ax = fig.subplots()
    for name, scores in values.items():
        ax.plot(thresholds, performance_profile(scores, thresholds), label=name)
    ax.set_xlabel(f"{unit} threshold")
    ax.set_ylabel("fraction of seeds above")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title("Performance profile over training seeds", fontsize=10)
    return fig
