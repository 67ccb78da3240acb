"""`planner.goal_reward_radius`: each planned transition is rewarded 1 where the position it
starts from is within the radius of its goal, 0 elsewhere, in place of the model's expected
reward; the rest of the score is unchanged."""

from __future__ import annotations

import pytest
import torch

from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.planning import BeamPlanner, PlannerConfig

SETTINGS = {"beam_width": 4, "n_expand": 2, "horizon": 3, "context_transitions": 1}


def test_planned_rewards_are_whether_each_transition_starts_at_the_goal(maze_checkpoint):
    episodes, _ = load_episodes("pointmaze/umaze-v0")  # the checkpoint's data
    at_goal = torch.as_tensor(episodes.observations[0]).clone()
    at_goal[0:2] = at_goal[2:4]  # the point on its goal
    away = torch.as_tensor(episodes.observations[0])
    observations = torch.stack([at_goal, away])
    radius = 0.45
    planner = BeamPlanner.from_checkpoint(maze_checkpoint, **SETTINGS, goal_reward_radius=radius)
    planner.reset(len(observations), seed=3)
    plan = planner.plan(observations)

    # The plain reference, from the decoded plan: distance of each transition's planned
    # position from its goal.
    goals = planner.goals
    position = plan.observations[..., goals.achieved]  # (E, B, H, 2)
    goal = plan.observations[..., goals.desired]
    expected = ((position - goal).norm(dim=-1) <= radius).float()  # (E, B, H)
    torch.testing.assert_close(plan.rewards, expected, rtol=0, atol=0)
    assert plan.rewards[0, :, 0].eq(1).all() and plan.rewards[1, :, 0].eq(0).all()
    # The score: those rewards, discounted, and the model's value after the last transition.
    discount, H = planner.config.discount, SETTINGS["horizon"]
    weights = discount ** torch.arange(H, dtype=torch.float32)
    scores = (plan.rewards * weights).sum(-1) + discount**H * plan.values[..., -1]
    torch.testing.assert_close(plan.scores, scores)

    # Without the rule the model's expected rewards score: not 0s and 1s.
    plain = BeamPlanner.from_checkpoint(maze_checkpoint, **SETTINGS)
    plain.reset(len(observations), seed=3)
    assert not torch.isin(plain.plan(observations).rewards, torch.tensor([0.0, 1.0])).all()


def test_goal_reward_radius_needs_a_goal_conditioned_model(tiny_checkpoint):
    with pytest.raises(ValueError, match=r"planner\.goal_reward_radius=null"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, **SETTINGS, goal_reward_radius=0.45)
    with pytest.raises(ValueError, match="goal_reward_radius must be positive"):
        PlannerConfig(goal_reward_radius=-1.0)
