"""`planner.goal_radius`: an env at its goal is searched for the plan that stays closest to it,
an env away from it exactly as without the rule."""

from __future__ import annotations

import pytest
import torch

from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.planning import BeamPlanner

SETTINGS = {"beam_width": 4, "n_expand": 2, "horizon": 3, "context_transitions": 1}


def plan_both(checkpoint, observations: torch.Tensor, **rule):
    planner = BeamPlanner.from_checkpoint(checkpoint, **SETTINGS, **rule)
    planner.reset(len(observations), seed=3)
    return planner, planner.plan(observations)


def test_an_env_at_its_goal_keeps_the_plan_that_stays_closest_and_the_others_plan_as_before(
    maze_checkpoint,
):
    episodes, _ = load_episodes("pointmaze/umaze-v0")  # the checkpoint's data
    last = int(episodes.lengths[0]) - 1
    at_goal = torch.as_tensor(episodes.observations[last]).clone()
    at_goal[0:2] = at_goal[2:4]  # the point on its goal, one the data reached
    away = torch.as_tensor(episodes.observations[0])  # the first episode's start and goal
    observations = torch.stack([at_goal, away])

    _, without = plan_both(maze_checkpoint, observations)
    planner, held = plan_both(maze_checkpoint, observations, goal_radius=0.45)

    decode, goals = planner.discretizer.decode, planner.goals
    encoded = planner.discretizer.encode(observations, slice(0, 8))
    distance = (
        decode(encoded[:, goals.achieved], goals.achieved)
        - decode(encoded[:, goals.desired], goals.desired)
    ).norm(dim=-1)
    assert distance[0] <= 0.45 < distance[1]  # as the planner sees them: through its bins
    # Away from its goal, the very same search.
    torch.testing.assert_close(held.tokens[1], without.tokens[1], rtol=0, atol=0)
    torch.testing.assert_close(held.scores[1], without.scores[1])
    # At its goal, every final beam scores minus the distance from the goal of its last
    # planned position, best first, as worked out again from its tokens.
    final = held.tokens[0, :, -1]  # (B, T) each beam's last transition
    position = decode(final[:, goals.achieved], goals.achieved)
    goal = decode(held.tokens[0, :, 0][:, goals.desired], goals.desired)
    torch.testing.assert_close(held.scores[0], -(position - goal).norm(dim=-1))
    assert int(held.best[0]) == int(held.scores[0].argmax())


def test_goal_radius_needs_a_goal_conditioned_model(tiny_checkpoint):
    with pytest.raises(ValueError, match=r"planner\.goal_radius=null"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, **SETTINGS, goal_radius=0.45)
    with pytest.raises(ValueError, match="goal_radius must be positive"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, **SETTINGS, goal_radius=0.0)
