"""`planner.goal_radius`: an env at its goal tries actions drawn uniformly over the bins and
keeps the plan whose positions keep closest to it (with `goal_velocity`, each carried on at its
planned velocity); an env away from it plans exactly as without the rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.planning import BeamPlanner, PlannerConfig

SETTINGS = {"beam_width": 4, "n_expand": 2, "horizon": 3, "context_transitions": 1}


def plan_both(checkpoint, observations: torch.Tensor, **rule):
    planner = BeamPlanner.from_checkpoint(checkpoint, **{**SETTINGS, **rule})
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
    # At its goal, every final beam scores minus the mean distance from the goal of its planned
    # positions, best first, as worked out again from its tokens.
    positions = held.tokens[0][..., goals.achieved]  # (B, H, 2)
    goal = decode(held.tokens[0, :, 0][:, goals.desired], goals.desired)  # (B, 2)
    mean_distance = (decode(positions, goals.achieved) - goal[:, None]).norm(dim=-1).mean(-1)
    torch.testing.assert_close(held.scores[0], -mean_distance)
    assert int(held.best[0]) == int(held.scores[0].argmax())


def test_at_its_goal_the_actions_tried_do_not_come_from_the_models_policy(maze_checkpoint):
    """The model's actions at a goal are the data's, which pass through goals: there the
    candidates draw theirs uniformly over the bins. A narrower filter of the model's actions
    changes the search away from the goal, and nothing of the one at it."""
    episodes, _ = load_episodes("pointmaze/umaze-v0")
    at_goal = torch.as_tensor(episodes.observations[0]).clone()
    at_goal[0:2] = at_goal[2:4]
    away = torch.as_tensor(episodes.observations[0])
    observations = torch.stack([at_goal, away])
    wide = {"goal_radius": 0.45, "beam_width": 32, "horizon": 2}
    _, broad = plan_both(maze_checkpoint, observations, **wide, cdf_act=None)
    planner, narrow = plan_both(maze_checkpoint, observations, **wide, k_act=2)
    torch.testing.assert_close(narrow.tokens[0], broad.tokens[0], rtol=0, atol=0)
    assert not torch.equal(narrow.tokens[1], broad.tokens[1])
    n_obs, n_bins = planner.observation_dim, planner.model.config.n_bins
    actions = broad.tokens[0][..., n_obs : n_obs + planner.action_dim].flatten()
    # 32 beams x 2 transitions x 2 actions: draws from both halves of the range, most bins.
    assert (actions < n_bins // 2).any() and (actions >= n_bins // 2).any()
    assert len(actions.unique()) >= 3 * n_bins // 4


def goal_and_start() -> torch.Tensor:
    """Two umaze observations, in this order: the first episode's start moved onto its goal,
    and that start."""
    episodes, _ = load_episodes("pointmaze/umaze-v0")
    start = torch.as_tensor(episodes.observations[0])
    at_goal = start.clone()
    at_goal[0:2] = at_goal[2:4]
    at_goal[4:6] = at_goal[2:4]  # the observation's own position too
    return torch.stack([at_goal, start])


def test_with_goal_velocity_an_env_at_its_goal_looks_ahead_at_its_planned_velocity(
    maze_checkpoint,
):
    observations = goal_and_start()
    _, without = plan_both(maze_checkpoint, observations)
    hold = {"goal_radius": 0.45, "goal_velocity": "observation[2:4]", "goal_lookahead": 0.7}
    planner, held = plan_both(maze_checkpoint, observations, **hold)
    assert planner.goal_velocity == slice(6, 8)  # after the goals (2 + 2) and the position (2)
    torch.testing.assert_close(held.tokens[1], without.tokens[1], rtol=0, atol=0)
    torch.testing.assert_close(held.scores[1], without.scores[1])
    decode, goals = planner.discretizer.decode, planner.goals
    tokens = held.tokens[0]  # (B, H, T)
    goal = decode(tokens[:, 0][:, goals.desired], goals.desired)  # (B, 2)
    ahead = decode(tokens[..., 0:2], goals.achieved) + 0.7 * decode(tokens[..., 6:8], slice(6, 8))
    torch.testing.assert_close(held.scores[0], -(ahead - goal[:, None]).norm(dim=-1).mean(-1))
    assert int(held.best[0]) == int(held.scores[0].argmax())
    _, plain = plan_both(maze_checkpoint, observations, goal_radius=0.45)
    assert not torch.equal(plain.scores[0], held.scores[0])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"goal_radius": 0.45, "goal_velocity": "observation"}, r"<key>\[start:stop\]"),
        ({"goal_radius": 0.45, "goal_velocity": "observation[3:2]"}, r"<key>\[start:stop\]"),
        ({"goal_velocity": "observation[2:4]"}, r"set planner\.goal_radius too"),
        ({"goal_radius": 0.45, "goal_lookahead": 0.0}, "goal_lookahead must be positive"),
    ],
)
def test_bad_hold_settings_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        PlannerConfig(**settings)


def test_goal_velocity_must_lie_within_the_models_observation(maze_checkpoint):
    with pytest.raises(ValueError, match="the achieved goal 2: it is the goal's velocity"):
        BeamPlanner.from_checkpoint(
            maze_checkpoint, **SETTINGS, goal_radius=0.45, goal_velocity="observation[1:4]"
        )
    for spec in ("observation[2:5]", "velocity[0:2]"):
        with pytest.raises(
            ValueError, match=r"not within this model's observation.*'observation': 4"
        ):
            BeamPlanner.from_checkpoint(
                maze_checkpoint, **SETTINGS, goal_radius=0.45, goal_velocity=spec
            )


def test_goal_radius_needs_a_goal_conditioned_model(tiny_checkpoint):
    with pytest.raises(ValueError, match=r"planner\.goal_radius=null"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, **SETTINGS, goal_radius=0.45)
    with pytest.raises(ValueError, match="goal_radius must be positive"):
        BeamPlanner.from_checkpoint(tiny_checkpoint, **SETTINGS, goal_radius=0.0)


@pytest.mark.parametrize("greedy", [{"deterministic": True}, {"k_act": 1}])
def test_goal_radius_needs_sampled_actions(greedy):
    with pytest.raises(ValueError, match=r"samples none .*planner\.goal_radius=null"):
        PlannerConfig(goal_radius=0.45, **greedy)


@torch.inference_mode()
def test_maze_greedy_plays_the_models_likeliest_actions_away_from_the_goal(maze_checkpoint):
    """`planner=maze-greedy`: away from the goal, every beam's first actions are the likeliest
    bin of each action dimension, as a plain pass of the model over the context gives them;
    at the goal, the hold's uniform actions."""
    from trajectory_transformer.cli.common import planner_preset

    observations = goal_and_start()
    assert (observations[1, 0:2] - observations[1, 2:4]).norm() > 2.0  # beyond the rule's 1.0
    preset = planner_preset("maze-greedy")
    assert (preset["goal_radius"], preset["cdf_act"]) == (1.0, 0.01)
    small = {"beam_width": 4, "n_expand": 2, "context_transitions": 2, "horizon": 2}
    planner = BeamPlanner.from_checkpoint(maze_checkpoint, **{**preset, **small})
    planner.reset(2, seed=3)
    planner.act(observations)  # a transition of context before the plan
    planner.observe(np.zeros(2), np.zeros(2, dtype=bool))
    plan = planner.plan(observations)
    model, values = planner.model, planner.discretizer.values
    n_obs, n_act = planner.observation_dim, planner.action_dim
    context = planner.context_tokens(observations)[1]
    real = planner.context_values(observations)[1].float()
    first_actions = plan.tokens[1, :, 0, n_obs : n_obs + n_act]  # (B, A)
    assert (first_actions == first_actions[0]).all()  # one first action for every beam
    for a, token in enumerate(first_actions[0]):
        logits = model(context[None], real[None])[0, -1]
        # The likeliest bin, up to float noise between the cached decode and this plain pass.
        torch.testing.assert_close(logits[token], logits.max(), atol=1e-4, rtol=1e-5)
        context = torch.cat([context, token[None]])
        real = torch.cat([real, values[n_obs + a, token][None].float()])
    held = plan.tokens[0, :, 0, n_obs : n_obs + n_act]
    assert len(held.unique(dim=0)) > 1  # at the goal: the hold's uniform draws
