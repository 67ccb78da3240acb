"""Sparse rewards (PointMaze: 0 everywhere but at the goal): what the beam search does when
every expected reward over the horizon is 0.

A candidate scores `sum_{i<=h} discount^i r_i + discount^(h+1) V_h`. With every `r_i` 0 the
score is `discount^(h+1) V_h`, so the expected values alone rank the candidates, at every step
of the search. When the values are all equal too, every score is the same: nothing is ranked,
and the beams that survive are whichever tied candidates `torch.topk` returns (torch does not
specify its order among equal values; the CPU build here returns later rows first). Every
candidate's actions were drawn from the model's action distribution given the context
(filtered by `cdf_act` and `k_act`), so the executed action is such a draw: the planner acts as
behaviour cloning that samples, not as the most likely action.
"""

from __future__ import annotations

import numpy as np
import torch
from conftest import tiny_gpt

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.planning import BeamPlanner
from trajectory_transformer.planning.sampling import filter_cdf

OBS, ACT, N = 3, 2, 11
T = OBS + ACT + 2
REWARD, VALUE = OBS + ACT, OBS + ACT + 1
# Sampled reward and value feedback, so that a tiny random model's beams differ enough to rank.
SEARCH = dict(
    horizon=3, beam_width=4, n_expand=2, context_transitions=2, cdf_act=0.6,
    reward_token="sample", value_token="sample",
)  # fmt: skip


def model(scale: float = 8.0):
    gpt = tiny_gpt(OBS, ACT, N, sequence_transitions=6, seed=0)
    with torch.no_grad():  # larger weights than the init, so that candidates differ
        for p in gpt.parameters():
            p.mul_(scale)
    return gpt


def discretizer(values: bool, strategy: str = "quantile") -> Discretizer:
    """Bins of data whose rewards are all 0, and whose values vary (or are all 0 too)."""
    data = np.random.default_rng(0).normal(size=(500, T))
    data[:, REWARD] = 0.0
    if not values:
        data[:, VALUE] = 0.0
    return Discretizer.fit(data, n_bins=N, strategy=strategy)


def observations(envs: int) -> np.ndarray:
    return np.random.default_rng(1).normal(size=(envs, OBS)).astype(np.float32)


def test_with_every_reward_zero_the_values_rank_the_beams():
    planner = BeamPlanner(model(), discretizer(values=True), **SEARCH)
    planner.reset(3)
    plan = planner.plan(observations(3))
    discount, H = planner.config.discount, SEARCH["horizon"]
    # A reward that is 0 in every transition of the data is expected to be 0 (to the float:
    # a never-seen token decodes to the smallest float above 0, see the report on this file).
    assert plan.rewards.abs().max() < 1e-40
    final = plan.values[..., -1]  # (E, B) the expected value after the last transition
    torch.testing.assert_close(plan.scores, discount**H * final, rtol=1e-6, atol=1e-30)
    assert (final.std(dim=-1) > 1e-3).all()  # values differ between beams: a real ranking
    assert (plan.scores[:, :-1] >= plan.scores[:, 1:]).all()  # best first
    assert (plan.best == 0).all()
    # The executed plan is the beam with the highest expected value.
    rows = torch.arange(3)
    assert torch.equal(final[rows, plan.best], final.max(dim=-1).values)


def test_with_rewards_and_values_all_equal_the_plan_is_a_sample_of_the_models_actions():
    gpt = model(scale=1.0)  # spread predictions: several action tokens are likely
    envs = 32  # one context, played in 32 envs at once
    planner = BeamPlanner(gpt, discretizer(values=False, strategy="uniform"), **SEARCH)
    planner.reset(envs)
    obs = np.repeat(observations(1), envs, axis=0)
    plan = planner.plan(obs)
    assert torch.equal(plan.scores, torch.zeros_like(plan.scores))  # nothing to rank
    assert (plan.best == 0).all()  # argmax of ties: the first of topk's order

    first_action = plan.tokens[torch.arange(envs), plan.best, 0, OBS]  # (E,) executed token
    # ... a draw from the model's distribution of the first action token given the context,
    # filtered as configured: varied, and inside the kept set.
    context = planner.context_tokens(obs)[0][None]  # (1, O): no past transitions yet
    with torch.no_grad():
        logits = gpt(context)[0, -1]  # (N,) the first action token's prediction
    kept = torch.isfinite(filter_cdf(logits, SEARCH["cdf_act"]))
    assert kept[first_action].all()
    assert len(first_action.unique()) > 1 and kept.sum() > 1
    # ... and, given the planner's seed, the same draw every time.
    planner.reset(envs)
    assert torch.equal(planner.plan(obs).tokens, plan.tokens)


def test_an_all_zero_reward_column_from_quantile_bins_is_zero_up_to_a_subnormal():
    """Why the first test allows 1e-40: with quantile bins a reward that is always 0 fills one
    bin; the bins it leaves unused decode to the next float above 0 (1.4e-45), so an expected
    reward is 0 or 1.4e-45, depending on whether the model puts more than half its mass on
    tokens the data never had. Next to any nonzero value the difference vanishes."""
    bins = discretizer(values=True)
    used = bins.effective_bins[REWARD]
    assert used == 1 and bins.values[REWARD, 0] == 0.0
    assert (bins.values[REWARD, 1:] == torch.finfo(torch.float32).smallest_normal * 2**-23).all()
    uniform = discretizer(values=False, strategy="uniform")
    assert (uniform.values[REWARD] == 0.0).all() and (uniform.values[VALUE] == 0.0).all()
