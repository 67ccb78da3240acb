"""Every figure draws from a real record or real diagnostics, titled and labelled."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch
from matplotlib.figure import Figure

from trajectory_transformer import viz
from trajectory_transformer.checkpoint import load_checkpoint
from trajectory_transformer.diagnostics import (
    attention_maps,
    compounding_error,
    dataset_tokens,
    dimension_names,
    plan_distributions,
    sample_windows,
    token_accuracy,
)
from trajectory_transformer.evaluation import (
    PlanSnapshot,
    make_env,
    record_episode,
    render_observations,
)
from trajectory_transformer.planning import BeamPlanner


@pytest.fixture
def recorded(tiny_checkpoint):
    pytest.importorskip("pygame", reason="Pendulum draws its frames with pygame (the test extra)")
    planner = BeamPlanner.from_checkpoint(
        tiny_checkpoint, beam_width=4, horizon=3, context_transitions=1
    )
    thunk = make_env(planner.dataset, render_mode="rgb_array", max_episode_steps=6)
    record = record_episode(planner, thunk, seed=0, plan_steps=(0, 4), render=True)
    return planner, record


def assert_readable(fig: Figure, legend: bool = True, every_axis_labelled: bool = True) -> None:
    assert isinstance(fig, Figure)
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.get_label() != "<colorbar>"]
    assert fig.get_suptitle() or all(ax.get_title() for ax in axes)
    for ax in axes:
        assert ax.get_title(), "every panel is titled"
        if every_axis_labelled:
            assert ax.get_xlabel() and ax.get_ylabel(), ax.get_title()
    assert any(ax.get_xlabel() for ax in axes) and any(ax.get_ylabel() for ax in axes)
    if legend:
        assert any(ax.get_legend() is not None for ax in axes)
    fig.canvas.draw()  # renders without error


def test_plan_figures(recorded):
    planner, record = recorded
    snapshot = record.plans[4]
    names = dimension_names(3, 1, "Pendulum-v1")
    beams = viz.plot_plan_beams(snapshot, record, names)
    assert_readable(beams)
    assert len([ax for ax in beams.axes if ax.get_visible()]) == 4  # 3 obs + 1 action
    distributions = plan_distributions(planner.model, snapshot)
    assert_readable(viz.plot_plan_predictions(snapshot, distributions, planner.discretizer, record))
    assert_readable(viz.plot_beam_scores(snapshot))
    assert_readable(viz.plot_episode_predictions(record))


def test_frame_figure_shows_imagined_and_executed_rows(recorded):
    planner, record = recorded
    snapshot = record.plans[0]
    env = make_env(planner.dataset, render_mode="rgb_array")()
    env.reset(seed=0)
    best = snapshot.plan.observations[0, snapshot.best].numpy()
    imagined = render_observations(env, best)
    fig = viz.plot_frames(imagined, record.frames[:3], step=0)
    assert fig.get_suptitle() and len(fig.axes) == 2 * 3
    assert [ax.get_ylabel() for ax in fig.axes[::3]] == ["imagined", "executed"]
    fig.canvas.draw()
    viz.plot_frames(None, record.frames[:3], step=0).canvas.draw()  # an env that cannot


def test_model_figures(tiny_checkpoint):
    checkpoint = load_checkpoint(tiny_checkpoint)
    transitions, windows = dataset_tokens(checkpoint)
    sample = sample_windows(windows, 8)
    names = dimension_names(3, 1, "Pendulum-v1")
    accuracy = token_accuracy(checkpoint.model, sample)
    error = checkpoint.discretizer.reconstruction_error(transitions)
    assert_readable(viz.plot_token_accuracy(accuracy, error, names), legend=True)
    maps = attention_maps(checkpoint.model, sample[0])
    # A grid of maps: the outer panels carry the axis labels.
    assert_readable(viz.plot_attention(maps, names), legend=False, every_axis_labelled=False)
    compounding = compounding_error(checkpoint.model, checkpoint.discretizer, sample, 1)
    assert_readable(viz.plot_compounding_error(compounding))


def test_save_episode_figures_writes_pngs(recorded, tmp_path):
    planner, record = recorded
    paths = viz.save_episode_figures(record, planner, tmp_path / "figures")
    names = sorted(path.name for path in paths)
    expected = ["episode_predictions.png"] + [
        f"plan_step{step}_{kind}.png"
        for step in (0, 4)
        for kind in ("beams", "predictions", "scores")
    ]
    assert names == sorted(expected)
    for path in paths:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_prediction_panels_say_when_probability_lies_off_the_plot(recorded):
    planner, record = recorded
    snapshot = record.plans[0]
    distributions = plan_distributions(planner.model, snapshot)
    middle = planner.discretizer.n_bins // 2
    centre = float(planner.discretizer.values[-1, middle])
    plan = replace(snapshot.plan, values=torch.full_like(snapshot.plan.values, centre))
    snapshot = PlanSnapshot(snapshot.step, snapshot.context, plan)

    def annotations(tail: float) -> list[str]:
        distributions.values[:] = 0.0
        distributions.values[:, middle] = 1.0 - tail
        distributions.values[:, 0] = tail  # too faint to widen the plot, far from the rest
        fig = viz.plot_plan_predictions(snapshot, distributions, planner.discretizer)
        return [text.get_text() for ax in fig.axes for text in ax.texts]

    assert any("1% of the probability" in text for text in annotations(0.008))
    assert annotations(0.0) == []


def test_maze_figure_draws_the_walls_the_beams_and_the_path(maze_checkpoint, tmp_path):
    planner = BeamPlanner.from_checkpoint(
        maze_checkpoint, beam_width=4, horizon=2, context_transitions=1
    )
    thunk = make_env(planner.dataset, max_episode_steps=6)
    record = record_episode(planner, thunk, seed=0, plan_steps=(0, 3))
    maze_map, point, goal = viz.maze_of(planner.dataset)
    assert maze_map[1][1] == "g" and (point, goal) == (slice(0, 2), slice(2, 4))
    fig = viz.plot_maze_plans(record, planner.dataset)
    assert_readable(fig)
    (ax,) = fig.axes
    assert len(ax.images) == 1  # the walls
    # two searches of 4 beams and their chosen plans, the path, the start and the goal
    assert len(ax.lines) == 2 * (4 + 1) + 3
    taken = ax.lines[-3].get_xydata()
    assert len(taken) == len(record) + 1
    assert "maze_plans.png" in [p.name for p in viz.save_episode_figures(record, planner, tmp_path)]


def test_maze_figure_marks_each_searchs_waypoint(maze_checkpoint):
    planner = BeamPlanner.from_checkpoint(
        maze_checkpoint, beam_width=2, horizon=2, context_transitions=1, waypoint_lead=0.5
    )
    thunk = make_env(planner.dataset, max_episode_steps=6)
    record = record_episode(planner, thunk, seed=0, plan_steps=(0, 3))
    (ax,) = viz.plot_maze_plans(record, planner.dataset, planner=planner).axes
    marks = [line for line in ax.lines if line.get_label().startswith("waypoint at")]
    assert [line.get_label() for line in marks] == ["waypoint at 0", "waypoint at 3"]
    goals = planner.goals
    for step, line in zip((0, 3), marks, strict=True):
        observation = np.asarray(record.observations[step])
        expected = planner.waypoints.waypoint(
            observation[goals.achieved], observation[goals.desired], 0.5
        )
        np.testing.assert_allclose(line.get_xydata()[0], expected)
    first = np.asarray(record.observations[0])
    assert not np.allclose(marks[0].get_xydata()[0], first[goals.desired])  # a far goal
    # Without waypoints, or without the planner, no marks.
    (plain,) = viz.plot_maze_plans(record, planner.dataset).axes
    assert not [line for line in plain.lines if line.get_label().startswith("waypoint")]


def test_maze_walls_are_drawn_in_the_envs_own_coordinates():
    # gymnasium-robotics: the maze centred on the origin, one unit a cell, row 0 at the top
    maze_map = [[1, 1, 1], [1, 0, 1], [1, 0, 0], [1, 1, 1]]
    ax = Figure().subplots()
    extent = viz.draw_maze_walls(ax, maze_map)
    assert extent == (-1.5, 1.5, -2.0, 2.0)
    (image,) = ax.images
    assert image.get_extent() == list(extent)
    assert image.get_array().tolist() == [[float(cell == 1) for cell in row] for row in maze_map]
    # the open cell at row 2, column 2 (x 1, y -0.5) is drawn where the env puts it
    x, y = 1.0, -0.5
    column = int((x - extent[0]) // 1)
    row = int((extent[3] - y) // 1)
    assert (row, column) == (2, 2) and image.get_array()[row, column] == 0.0


def test_a_dataset_that_is_no_maze_has_no_maze_figure(recorded):
    planner, record = recorded
    assert viz.maze_of(planner.dataset) is None
    with pytest.raises(ValueError, match="is not a maze"):
        viz.plot_maze_plans(record, planner.dataset)
