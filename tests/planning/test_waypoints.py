"""Waypoints toward a far goal (`planner.waypoint_lead`): the shortest ways through the cells the
data's steps cross, against a plain all-pairs reference and a hand-worked corridor, and the
agent that hands them to the agent it wraps."""

from __future__ import annotations

import dataclasses
import json
import math
import warnings

import numpy as np
import pytest
import torch
from conftest import run_module, untrained_critic

from trajectory_transformer.data.goals import GoalLayout
from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.planning import BeamPlanner, PlannerConfig
from trajectory_transformer.planning.waypoints import (
    WaypointAgent,
    WaypointGraph,
    head_for_waypoints,
)

# A corridor round a wall, one cell wide, walked from cell centre to cell centre: along the
# bottom row (y 0.5) from x 0.5 to 4.5, up to y 2.5, and back along the top row to x 0.5. The
# straight line from the first cell to the last crosses the wall (y 1.5, x 0.5 to 3.5).
CORRIDOR = (
    [(x + 0.5, 0.5) for x in range(5)] + [(4.5, 1.5)] + [(x + 0.5, 2.5) for x in range(4, -1, -1)]
)


def corridor_graph(both_ways: bool = True) -> WaypointGraph:
    """The corridor walked once each way (or forwards alone), in cells of width 1."""
    forwards = np.array(CORRIDOR)
    episodes = [forwards, forwards[::-1]] if both_ways else [forwards]
    return WaypointGraph(np.concatenate(episodes), np.array([len(e) for e in episodes]), 1.0)


def test_waypoints_follow_the_data_round_the_wall():
    graph = corridor_graph()
    start, goal = np.array(CORRIDOR[0]), np.array(CORRIDOR[-1])
    distance, _ = graph.to_goal(graph.node(goal))
    assert distance[graph.node(start)] == pytest.approx(10.0)  # 4 right, 2 up, 4 left
    # Lead 3 from the start: three cells along the bottom row, not up through the wall.
    np.testing.assert_allclose(graph.waypoint(start, goal, 3.0), [3.5, 0.5])
    np.testing.assert_allclose(graph.waypoint(np.array([4.5, 0.5]), goal, 2.5), [3.5, 2.5])
    # The first cell at least the lead along: 1.5 ahead of the turn's cell is 2 ahead.
    np.testing.assert_allclose(graph.waypoint(np.array([4.5, 1.5]), goal, 1.5), [3.5, 2.5])
    # Within the lead of the goal, the goal itself, where it lies in a cell or not.
    near = np.array([0.7, 2.8])
    np.testing.assert_array_equal(graph.waypoint(np.array([2.5, 2.5]), near, 3.0), near)
    # Positions between cell centres, and outside every cell, take the nearest cell's way.
    np.testing.assert_allclose(graph.waypoint(np.array([0.1, 0.9]), goal, 3.0), [3.5, 0.5])
    np.testing.assert_allclose(graph.waypoint(np.array([-3.0, 0.4]), goal, 3.0), [3.5, 0.5])


def test_a_way_the_data_never_goes_leaves_the_goal():
    graph = corridor_graph(both_ways=False)  # the data goes from the bottom row to the top alone
    end, start = np.array(CORRIDOR[-1]), np.array(CORRIDOR[0])
    distance, next_cell = graph.to_goal(graph.node(start))
    assert math.isinf(distance[graph.node(end)]) and next_cell[graph.node(end)] == -1
    np.testing.assert_array_equal(graph.waypoint(end, start, 2.0), start)
    np.testing.assert_allclose(graph.waypoint(start, end, 2.0), [2.5, 0.5])  # forwards: a way


def all_pairs_reference(positions: np.ndarray, lengths: np.ndarray, cell: float):
    """Cells, their centres and every shortest distance between them (Floyd-Warshall), written
    plainly from the definition: a cell per occupied grid square at its goals' mean, an edge
    wherever a step within an episode changes cell, as long as the line between the centres."""
    keys = sorted({tuple(np.floor(p / cell).astype(int)) for p in positions})
    node = {key: i for i, key in enumerate(keys)}
    rows = [node[tuple(np.floor(p / cell).astype(int))] for p in positions]
    centres = np.array([positions[[r == i for r in rows]].mean(axis=0) for i in range(len(keys))])
    n = len(keys)
    distance = np.full((n, n), np.inf)
    np.fill_diagonal(distance, 0.0)
    row = 0
    for length in lengths:
        for step in range(row, row + length - 1):
            a, b = rows[step], rows[step + 1]
            if a != b:
                distance[a, b] = np.linalg.norm(centres[a] - centres[b])
        row += length
    for k in range(n):
        distance = np.minimum(distance, distance[:, k : k + 1] + distance[k : k + 1, :])
    return keys, centres, distance


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_shortest_ways_match_a_plain_all_pairs_reference(seed):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 40, size=12)
    positions = np.concatenate([np.cumsum(rng.normal(0, 0.4, (n, 2)), axis=0) for n in lengths])
    graph = WaypointGraph(positions, lengths, 0.5)
    keys, centres, reference = all_pairs_reference(positions, lengths, 0.5)
    assert graph.num_cells == len(keys)
    order = [graph.node(centre) for centre in centres]  # each reference cell's node
    np.testing.assert_allclose(graph.centres[order], centres, rtol=1e-12)
    for goal, node in enumerate(order):
        distance, next_cell = graph.to_goal(node)
        np.testing.assert_allclose(distance[order], reference[:, goal], rtol=1e-9)
        # Each next cell is one step of a shortest way.
        ahead = np.flatnonzero(np.isfinite(distance) & (next_cell >= 0))
        step = np.linalg.norm(graph.centres[ahead] - graph.centres[next_cell[ahead]], axis=1)
        np.testing.assert_allclose(distance[ahead], step + distance[next_cell[ahead]], rtol=1e-9)


class RecordingAgent:
    """Returns zeros and keeps what it was shown."""

    def __init__(self) -> None:
        self.seen, self.calls = [], []

    def reset(self, num_envs, seed=None):
        self.calls.append(("reset", num_envs, seed))

    def act(self, observations, active=None):
        self.seen.append(observations.copy())
        return np.zeros((len(observations), 2))

    def observe(self, rewards, dones):
        self.calls.append(("observe", list(rewards), list(dones)))


def test_the_agent_sees_waypoints_in_place_of_far_goals():
    goals = GoalLayout(achieved=slice(0, 2), desired=slice(2, 4))
    inner = RecordingAgent()
    agent = WaypointAgent(inner, corridor_graph(), goals, lead=3.0)
    far = [*CORRIDOR[0], *CORRIDOR[-1], 0.1, 0.2, 0.3, 0.4]  # 10 along the corridor
    near = [*CORRIDOR[-3], *CORRIDOR[-1], 0.5, 0.6, 0.7, 0.8]  # 2 along it
    observations = np.array([far, near], dtype=np.float32)
    given = observations.copy()
    agent.reset(2, seed=7)
    actions = agent.act(observations)
    agent.observe(np.array([0.0, 1.0]), np.array([False, True]))
    assert actions.shape == (2, 2)
    np.testing.assert_array_equal(observations, given)  # the caller's array is left alone
    seen = inner.seen[0]
    np.testing.assert_allclose(seen[0, 2:4], [3.5, 0.5])
    np.testing.assert_array_equal(seen[1], given[1])
    np.testing.assert_array_equal(np.delete(seen[0], [2, 3]), np.delete(given[0], [2, 3]))
    assert inner.calls == [("reset", 2, 7), ("observe", [0.0, 1.0], [False, True])]
    agent.reset_env(0, seed=3)  # the inner agent has none: nothing to pass on


def test_the_search_plans_from_the_waypoint(maze_checkpoint):
    """`planner.waypoint_lead` plans as the same search given the waypoint for the goal."""
    settings = {"horizon": 2, "beam_width": 2, "context_transitions": 1}
    headed = BeamPlanner.from_checkpoint(maze_checkpoint, **settings, waypoint_lead=0.3)
    plain = BeamPlanner.from_checkpoint(maze_checkpoint, **settings)
    goals = headed.goals
    episodes, _ = load_episodes("pointmaze/umaze-v0")  # maze_checkpoint built it
    observations = episodes.observations[[0, 1]]  # an episode's start, its goal far away
    heading = head_for_waypoints(observations, headed.waypoints, goals, 0.3)
    moved = np.linalg.norm(heading[:, goals.desired] - observations[:, goals.desired], axis=1)
    assert (moved > 0.1).all()
    np.testing.assert_array_equal(
        np.delete(heading, goals.desired, 1), np.delete(observations, goals.desired, 1)
    )
    for planner in (headed, plain):
        planner.reset(2, seed=0)
    for kept, given in zip(
        headed.context_tokens(observations), plain.context_tokens(heading), strict=True
    ):
        assert torch.equal(kept, given)
    np.testing.assert_allclose(headed.act(observations), plain.act(heading), atol=1e-6)


def test_a_dataset_without_goals_has_no_waypoints(tiny_dataset):
    _, info = load_episodes("test/tiny-v0")
    with pytest.raises(
        ValueError,
        match=r"test/tiny-v0.s observations have a flat Box; leave planner\.waypoint_lead",
    ):
        WaypointGraph.of_dataset(info, 0.25)


def test_waypoints_from_other_data_than_the_agents_warn(maze_checkpoint):
    _, info = load_episodes("pointmaze/umaze-v0")  # maze_checkpoint built it
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        WaypointGraph.of_dataset(info, 0.25)  # the same data: silent
    other = dataclasses.replace(info, fingerprint="0" * 16)
    with pytest.warns(UserWarning, match=r"not the data the model or critic was trained on"):
        graph, _ = WaypointGraph.of_dataset(other, 0.25)
    assert graph.num_cells > 0  # still built: the paths run through the same maze


def test_a_model_without_goals_is_refused_waypoints(tiny_checkpoint):
    settings = {"horizon": 2, "context_transitions": 1, "waypoint_lead": 1.0}
    with pytest.raises(ValueError, match=r"leave planner\.waypoint_lead=null"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, **settings)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"waypoint_lead": 0.0}, "waypoint_lead must be positive"),
        ({"waypoint_lead": 1.0, "waypoint_cell": -0.5}, "waypoint_cell must be positive"),
    ],
)
def test_bad_waypoint_settings_are_refused(settings, message):
    with pytest.raises(ValueError, match=message):
        PlannerConfig(**settings)


def test_tt_eval_plays_toward_waypoints(tmp_path, maze_checkpoint, tiny_checkpoint):
    common = [
        "planner.horizon=2",
        "planner.beam_width=2",
        "planner.context_transitions=1",
        "eval.episodes=2",
        "eval.num_envs=2",
        "eval.max_episode_steps=5",
        "eval.progress=false",
        "device=cpu",
        "planner.waypoint_lead=1.0",
    ]
    played = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={maze_checkpoint}",
        *common,
        f"hydra.run.dir={tmp_path / 'eval'}",
    )
    assert played.returncode == 0, played.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["lengths"] == [5, 5]
    assert results["settings"]["planner"]["waypoint_lead"] == 1.0
    assert results["settings"]["planner"]["waypoint_cell"] == 0.25

    # A dataset without goals, and the behaviour policy, are refused in one line each.
    flat = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={tiny_checkpoint}",
        *common,
        f"hydra.run.dir={tmp_path / 'flat'}",
    )
    assert flat.returncode == 2
    assert "leave planner.waypoint_lead=null" in flat.stderr
    assert "Traceback" not in flat.stderr
    behaviour = run_module(
        "trajectory_transformer.cli.evaluate",
        "checkpoint=behaviour:pointmaze/umaze-v0",
        *common,
        f"hydra.run.dir={tmp_path / 'behaviour'}",
    )
    assert behaviour.returncode == 2
    assert "leave planner.waypoint_lead unset" in behaviour.stderr


def test_tt_eval_heads_a_critics_policy_for_waypoints(tmp_path, maze_checkpoint):
    path = tmp_path / "critic.pt"
    untrained_critic(path, "pointmaze/umaze-v0")  # maze_checkpoint built it
    played = run_module(
        "trajectory_transformer.cli.evaluate",
        f"checkpoint={path}",
        "planner=iql",
        "planner.waypoint_lead=0.5",
        "eval.episodes=1",
        "eval.max_episode_steps=5",
        "eval.progress=false",
        "device=cpu",
        f"hydra.run.dir={tmp_path / 'eval'}",
    )
    assert played.returncode == 0, played.stderr
    settings = json.loads((tmp_path / "eval" / "results.json").read_text())["settings"]
    assert settings["planner"] == {
        "agent": "iql",
        "critic": str(path.resolve()),
        "waypoint_lead": 0.5,
        "waypoint_cell": 0.25,
    }
