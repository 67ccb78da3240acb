"""scripts/goal_holding.py: what holding the goal would score, and the model's step near it."""

from __future__ import annotations

import goal_holding  # scripts/, on pytest's path
import numpy as np
import pytest
import torch
from conftest import untrained_critic


def test_an_episode_that_stayed_from_its_first_arrival_counts_every_step_after_it():
    # 10 steps each: reached at step 4 and held 3 of the 6 steps after (return 3); never
    # reached (return 0); reached at step 0 and held throughout (return 10).
    stayed = goal_holding.returns_had_it_stayed(
        returns=[3.0, 0.0, 10.0], lengths=[10, 10, 10], first=[4, None, 0], held=[3, 0, 10]
    )
    np.testing.assert_array_equal(stayed, [6.0, 0.0, 10.0])


def test_steps_and_errors_are_split_by_the_distance_from_the_goal():
    errors = goal_holding.OneStepErrors(slice(0, 2), slice(2, 4), radius=1.0)
    errors.rows = [(True, 0.01, 0.2), (True, 0.03, 0.4), (False, 0.05, 0.1)]
    assert errors.means(True) == pytest.approx((0.02, 0.3))
    assert errors.means(False) == pytest.approx((0.05, 0.1))
    errors.rows = errors.rows[2:]
    assert errors.means(True) is None


def test_the_row_of_an_untrained_maze_model(maze_checkpoint, capsys):
    search = f"checkpoint={maze_checkpoint} planner=maze planner.horizon=2 planner.beam_width=2"
    (row,) = goal_holding.main(["--search", search, "--episodes", "2", "--envs", "2"])
    assert len(row) == len(goal_holding.COLUMNS)
    assert row[0] == "pointmaze/umaze-v0, 12 bins, discount 0.99"
    assert row[1] == "`planner=maze`, `planner.horizon=2`, `planner.beam_width=2`"
    assert 0 < float(row[2]) < 1  # the position bins of a maze some units wide
    assert row[4].endswith("of 2")
    float(row[6])  # the score had it stayed, always a number
    # Steps away from the goal happen in every episode; their error is a distance.
    assert float(row[9]) >= 0 and float(row[10]) >= 0
    assert "|" in capsys.readouterr().out


def test_a_model_is_named_by_the_steps_it_was_trained_for(maze_checkpoint):
    """A training stopped early, or still under way, has fewer steps than it planned."""
    payload = torch.load(maze_checkpoint, weights_only=False)
    payload["config"]["trainer"] = {"max_steps": 16000}
    payload["training"] = {"step": 1234, "finished": False}
    torch.save(payload, maze_checkpoint)
    search = f"checkpoint={maze_checkpoint} planner=maze planner.horizon=1 planner.beam_width=1"
    (row,) = goal_holding.main(["--search", search, "--episodes", "1", "--envs", "1"])
    assert row[0] == "pointmaze/umaze-v0, 12 bins, discount 0.99, 1,234 steps"


def test_a_search_toward_waypoints_plays_them(maze_checkpoint):
    search = f"checkpoint={maze_checkpoint} planner=maze-hold planner.horizon=2 "
    search += "planner.beam_width=2 planner.waypoint_lead=0.5"
    *_, planner = goal_holding.planner_of(search.split())
    assert planner.config.waypoint_lead == 0.5
    assert planner.waypoints.cell == 0.25  # the default cells
    (row,) = goal_holding.main(["--search", search, "--episodes", "1", "--envs", "1"])
    assert row[0] == "pointmaze/umaze-v0, 12 bins, discount 0.99"
    assert row[1].endswith("`planner.waypoint_lead=0.5`")


def test_a_search_names_one_checkpoint():
    with pytest.raises(SystemExit, match="one checkpoint"):
        goal_holding.main(["--search", "planner=maze"])


def test_a_search_of_one_transition_scores_without_a_predicted_step(maze_checkpoint):
    search = f"checkpoint={maze_checkpoint} planner=bc planner.context_transitions=1"
    (row,) = goal_holding.main(["--search", search, "--episodes", "2", "--envs", "2"])
    assert row[4].endswith("of 2")
    float(row[3].split(" ± ")[0])  # scored
    assert row[7:] == ["", "", "", ""]  # no imagined next position to measure


def test_a_trained_model_is_named_with_its_seed():
    """Models of one dataset trained with other seeds tell their rows apart."""
    from trajectory_transformer.planning import BeamPlanner

    planner = BeamPlanner.from_checkpoint("pretrained:pointmaze/medium-v0")
    planner.training_config = {**planner.training_config, "seed": 3}
    assert goal_holding.model_name(planner, 12000) == (
        "pointmaze/medium-v0, 100 bins, discount 0.99, seed 3, 12,000 steps"
    )


def test_a_model_trained_on_windows_that_reach_their_goals_says_so():
    from trajectory_transformer.planning import BeamPlanner

    planner = BeamPlanner.from_checkpoint("pretrained:pointmaze/medium-v0")
    config = planner.training_config
    planner.training_config = {**config, "dataset": {**config["dataset"], "relabel_reached": 0.25}}
    assert goal_holding.model_name(planner, 8000) == (
        "pointmaze/medium-v0, 100 bins, discount 0.99, relabel_reached 0.25, seed 0, 8,000 steps"
    )
    dataset = {**planner.training_config["dataset"], "relabel_continuing_rewards": "scaled"}
    planner.training_config = {**config, "dataset": dataset}
    assert "relabel_reached 0.25 (scaled), seed 0" in goal_holding.model_name(planner, 8000)


def test_a_critics_iql_policy_plays_named_by_its_hindsight_goals(maze_checkpoint, tmp_path):
    from trajectory_transformer.planning.waypoints import WaypointAgent

    path = tmp_path / "critic.pt"
    config = {"critic": {"relabel_goals": 0.8}, "seed": 3}
    untrained_critic(path, "pointmaze/umaze-v0", config, step=500)  # maze_checkpoint built it
    search = f"checkpoint={path} planner=iql"
    (row,) = goal_holding.main(["--search", search, "--episodes", "2", "--envs", "2"])
    name, overrides, bin_width, score, reached, *_, near, error, away, away_error = row
    assert name == "critic of pointmaze/umaze-v0, relabel_goals 0.8, seed 3, 500 steps"
    assert overrides == "`planner=iql`" and bin_width == ""
    assert reached.endswith("of 2") and "±" in score
    assert near == error == away == away_error == ""  # no plan: no predicted step

    # Headed for waypoints, the policy is wrapped: it has no planner settings of its own.
    search += " planner.waypoint_lead=0.5"
    *_, agent = goal_holding.planner_of(search.split())
    assert isinstance(agent, WaypointAgent) and agent.lead == 0.5
    (row,) = goal_holding.main(["--search", search, "--episodes", "1", "--envs", "1"])
    assert row[1] == "`planner=iql`, `planner.waypoint_lead=0.5`"
