"""`planner.goal_radius`: an env at its goal tries actions drawn uniformly over the bins and
keeps the plan whose positions keep closest to it (with `goal_velocity`, each carried on at its
planned velocity); an env away from it plans exactly as without the rule."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from conftest import set_discretizer_values

from trajectory_transformer.data.minari_source import load_episodes
from trajectory_transformer.model import TrajectoryGPT
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


HOLD = {"goal_radius": 0.45, "goal_velocity": "observation[2:4]", "goal_lookahead": 0.7}


def expected_lookahead(planner, context: torch.Tensor, real: torch.Tensor, action) -> float:
    """A plain reference for one tried action: the model over the context and the action, one
    token at a time, the likeliest fed back; the next position's and velocity's expected values
    carried on for the look-ahead, and their distance from the goal."""
    model, values = planner.model, planner.discretizer.values
    n_obs, n_act = planner.observation_dim, planner.action_dim
    sequence, inputs = context.clone(), real.float().clone()
    next_observation = torch.zeros(n_obs)
    for column in [*range(n_obs, n_obs + n_act + 2), *range(8)]:
        if n_obs <= column < n_obs + n_act:
            token = torch.as_tensor(action[column - n_obs])
        else:
            logits = model(sequence[None], inputs[None])[0, -1]
            token = logits.argmax()
            if column < n_obs:
                next_observation[column] = logits.softmax(-1) @ values[column]
        sequence = torch.cat([sequence, token[None]])
        inputs = torch.cat([inputs, values[column, token][None].float()])
    goal = values[2:4].gather(1, context[-n_obs + 2 : -n_obs + 4, None])[:, 0]
    ahead = next_observation[0:2] + 0.7 * next_observation[6:8]
    return float((ahead - goal).norm())


INPUTS = {
    "tokens": {},
    "values": {"value_inputs": True},
    "observation-vector": {"value_inputs": True, "observation_vector": True},
}
"""What a held planner's model takes: its tokens alone; their real values too; and with them
each transition's observation as one vector."""


def held_planner(checkpoint, inputs: str = "tokens", **settings) -> BeamPlanner:
    """The maze checkpoint's planner over a model of its shape with seeded random weights,
    large enough that the next position depends on the action, taking `inputs` (`INPUTS`)."""
    planner = BeamPlanner.from_checkpoint(checkpoint, **{**SETTINGS, **HOLD, **settings})
    config = dataclasses.replace(planner.model.config, **INPUTS[inputs])
    torch.manual_seed(1)
    model = TrajectoryGPT(config).eval()
    if config.value_inputs:
        set_discretizer_values(model, planner.discretizer)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return BeamPlanner(
        model,
        planner.discretizer,
        planner.config,
        action_low=planner.action_low,
        action_high=planner.action_high,
        dataset=planner.dataset,
        training_config=planner.training_config,
    )


@pytest.mark.parametrize("every_env", [False, True], ids=["held-envs", "every-env"])
@pytest.mark.parametrize("inputs", list(INPUTS))
@torch.inference_mode()
def test_with_goal_tries_an_env_at_its_goal_plays_the_tried_action_expected_to_stay_closest(
    maze_checkpoint, inputs, every_env
):
    """On the CPU only the held envs are judged; on a GPU every env is, and a mask picks
    (`every_env`, run here on the CPU)."""
    observations = goal_and_start()
    plans = {}
    for tries in (None, 6):
        planner = held_planner(maze_checkpoint, inputs, goal_tries=tries)
        planner._hold_judges_every_env = every_env
        planner.reset(2, seed=3)
        plans[tries] = planner.plan(observations)
    searched, held = plans[None], plans[6]
    n_obs, n_act = planner.observation_dim, planner.action_dim
    # Away from its goal, the very same plans; at it, the search's plans but their first action.
    torch.testing.assert_close(held.tokens[1], searched.tokens[1], rtol=0, atol=0)
    torch.testing.assert_close(held.tokens[0, :, 1:], searched.tokens[0, :, 1:], rtol=0, atol=0)
    first = held.tokens[0, :, 0, n_obs : n_obs + n_act]  # (B, A)
    assert (first == first[0]).all()
    # The tries are env 0's next draws after its search: drawn again from a copy of its
    # generator, each judged by the plain reference.
    replay = held_planner(maze_checkpoint, inputs)
    replay.reset(2, seed=3)
    replay.plan(observations)
    tries = torch.randint(planner.model.config.n_bins, (6, n_act), generator=replay.generators[0])
    context = planner.context_tokens(observations)[0]
    real = planner.context_values(observations)[0]
    distances = [expected_lookahead(planner, context, real, action) for action in tries]
    chosen = [i for i, action in enumerate(tries) if action.tolist() == first[0].tolist()]
    assert chosen, "the action played is not one of the tries"
    assert max(distances) - min(distances) > 1e-3  # the tries differ, so choosing matters
    # The closest, up to float noise between the batched passes and these plain ones.
    assert min(distances[i] for i in chosen) == pytest.approx(min(distances), abs=1e-4)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"goal_tries": 8}, r"set planner\.goal_radius too"),
        ({"goal_radius": 0.45, "goal_tries": 0}, "goal_tries must be at least 1"),
        ({"goal_radius": 0.45, "goal_tries": 8, "plan_every": 2}, r"set planner\.plan_every=1"),
    ],
)
def test_bad_goal_tries_are_refused_in_one_line(settings, message):
    with pytest.raises(ValueError, match=message):
        PlannerConfig(**settings)


def test_goal_tries_must_fit_the_next_observation_in_the_models_block(maze_checkpoint):
    """The search fits a context of all but one of the model's transitions and a horizon of
    one; the tried action's next observation, past that transition, does not."""
    n = BeamPlanner.from_checkpoint(maze_checkpoint, **SETTINGS).model.config.sequence_transitions
    settings = {**SETTINGS, **HOLD, "horizon": 1, "goal_tries": 4}
    BeamPlanner.from_checkpoint(maze_checkpoint, **{**settings, "context_transitions": n - 2})
    search_alone = {**settings, "goal_tries": None, "context_transitions": n - 1}
    BeamPlanner.from_checkpoint(maze_checkpoint, **search_alone)
    with pytest.raises(ValueError, match=r"lower planner\.context_transitions"):
        BeamPlanner.from_checkpoint(maze_checkpoint, **{**settings, "context_transitions": n - 1})
