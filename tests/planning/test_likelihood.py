"""`planner.value=likelihood`: beams scored by the log-probability of their planned actions
under the model, as a plain full-sequence pass computes it (the batched planner against the
naive reference: tests/planning/test_beam.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import set_discretizer_values
from test_beam import OBS, SMALL, T, run_steps, tiny_discretizer, tiny_model

from trajectory_transformer.planning import BeamPlanner, PlannerConfig

ACT = T - OBS - 2


@pytest.mark.parametrize("real_values", [False, True])
@torch.inference_mode()
def test_a_beams_score_is_its_actions_log_probability_under_the_model(real_values) -> None:
    """With `real_values`, a model that reads values and the observation's vector (the default
    recipe's): the reference feeds each beam's sequence with the context's real values and
    what the planned tokens decode to beside its tokens."""
    disc = tiny_discretizer(n_bins=64)
    model = tiny_model(
        n_bins=64, scale=2.0, value_inputs=real_values, observation_vector=real_values
    )
    if real_values:
        model = set_discretizer_values(model, disc)
    planner = BeamPlanner(model, disc, value="likelihood", seed=3, **SMALL)
    planner.reset(2)
    obs = run_steps(planner, 3)
    plan = planner.plan(obs)
    H = planner.config.horizon
    contexts, values = planner.context_tokens(obs), planner.context_values(obs)
    for env, context in enumerate(contexts):
        start = len(context) - OBS  # where the plan's first observation sits
        for beam in range(planner.config.beam_width):
            planned = plan.tokens[env, beam].reshape(-1)[OBS:]  # after the current observation
            sequence = torch.cat([context, planned])
            dims = torch.arange(len(context), len(sequence)) % T
            real = torch.cat([values[env].float(), disc.values[dims, planned]])
            log_p = model(sequence[None], real[None])[0].log_softmax(dim=-1)  # i predicts i + 1
            expected = sum(
                log_p[start + h * T + OBS + a - 1, sequence[start + h * T + OBS + a]]
                for h in range(H)
                for a in range(ACT)
            )
            torch.testing.assert_close(plan.scores[env, beam], expected, atol=1e-4, rtol=1e-5)
    # Best first, and the model's rewards and values are still recorded.
    assert torch.all(plan.scores[:, :-1] >= plan.scores[:, 1:])
    assert torch.all(plan.values != 0)


def test_likelihood_picks_other_beams_than_the_values() -> None:
    model, disc = tiny_model(n_bins=64, scale=2.0), tiny_discretizer(n_bins=64)
    obs = np.random.default_rng(0).normal(size=(2, OBS))
    plans = {}
    for value in ("model", "likelihood"):
        planner = BeamPlanner(model, disc, seed=5, value=value, **SMALL)
        planner.reset(2)
        plans[value] = planner.plan(obs)
    assert not torch.equal(plans["model"].tokens, plans["likelihood"].tokens)


def test_an_unknown_objective_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="model, critic or likelihood"):
        PlannerConfig(value="reward")


def test_goal_rewards_are_refused_where_likelihood_alone_scores() -> None:
    with pytest.raises(ValueError, match=r"planner\.goal_reward_radius=null"):
        PlannerConfig(value="likelihood", goal_reward_radius=0.45)
