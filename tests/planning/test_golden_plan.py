"""A small plan pinned to fixed numbers: refactors of the planner, the model or the cache must
leave greedy and sampled plans unchanged for the same seed.

Both decode paths, the native kernels and the PyTorch modules, are held to the file. Their
floats differ in the last bits, as they do between CPUs and compilers, and a token chosen by a
near-tie could flip with them. So the file also pins each planned token's decision margin: the
largest relative noise on the model's logits (probed from 1e-5 to 1e-2, in several random
directions) under which the token, and everything the search chose before it, stays the same.
A token is compared exactly where its margin is at least `MARGIN`, a hundred times the float32
differences between the paths; a beam's score (rtol 1e-4) where all its tokens are; the best
beam's actions where its tokens are. Nearly all tokens must be compared (`MIN_COMPARED`), so
the test keeps failing for a change in the scoring rule, the mask or the sampling.

`golden_plan.json` was written by this file's `golden()` and `margins()` on the code it pins
(`python tests/planning/test_golden_plan.py`); rewrite it only for a change that is meant to
alter plans, and say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.model.decode.native import native_kernels
from trajectory_transformer.planning import BeamPlanner

GOLDEN = Path(__file__).with_name("golden_plan.json")
OBS, ACT, N = 3, 2, 13
T = OBS + ACT + 2
# Sampled reward and value feedback (not the default): the plan then draws from every kind of
# token, so the pin covers the most of the sampling; greedy feedback is checked against the
# naive planner in test_beam.py.
SETTINGS = dict(
    horizon=3, beam_width=4, n_expand=2, context_transitions=2, cdf_act=0.9, k_obs=2,
    reward_token="sample", value_token="sample",
)  # fmt: skip
NOISE_SCALES = (1e-5, 1e-4, 1e-3, 1e-2)
"""Relative noise on the logits probed by `margins()`."""
NOISE_DIRECTIONS = 6
"""Random noise draws per scale."""
MARGIN = 1e-4
"""Tokens whose margin is at least this are compared exactly."""
MIN_COMPARED = 0.9
"""The fraction of pinned tokens that the file must let the test compare."""


def with_logit_noise(model, scale: float, seed: int) -> None:
    """Add noise of `scale` times each row's largest |logit| to every logit the planner sees
    (the model's `prefill` and `decoder`), from a generator of its own."""
    generator = torch.Generator().manual_seed(seed)
    prefill, decoder = model.prefill, model.decoder

    def noisy(logits: torch.Tensor) -> torch.Tensor:
        noise = torch.randn(logits.shape, generator=generator)
        return logits + scale * logits.abs().amax(-1, keepdim=True) * noise

    def noisy_decoder(cache):
        step = decoder(cache)
        return lambda tokens, position: noisy(step(tokens, position))

    model.prefill = lambda *args, **kwargs: noisy(prefill(*args, **kwargs))
    model.decoder = noisy_decoder


def golden(noise: tuple[float, int] | None = None) -> dict:
    """Plans of a seeded tiny model for three envs with mixed histories, greedy and sampled;
    with `noise` (scale, seed), under that noise on the logits."""
    model = tiny_gpt(OBS, ACT, N, sequence_transitions=6, seed=11)
    with torch.no_grad():  # larger weights than the init, so that beams and tokens differ
        for p in model.parameters():
            p.mul_(6.0)
    if noise is not None:
        with_logit_noise(model, *noise)
    data = np.random.default_rng(11).normal(size=(600, T))
    discretizer = Discretizer.fit(data, N, "quantile")
    result = {}
    for name, deterministic in (("greedy", True), ("sampled", False)):
        planner = BeamPlanner(model, discretizer, deterministic=deterministic, seed=0, **SETTINGS)
        planner.reset(3, autoreset_mode="SameStep")  # a done env's next observation is new
        rng = np.random.default_rng(2)
        for step in range(3):
            planner.act(rng.normal(size=(3, OBS)))
            planner.observe(rng.normal(size=3), np.array([False, step == 1, False]))
        plan = planner.plan(rng.normal(size=(3, OBS)))
        result[name] = {
            "tokens": plan.tokens.tolist(),
            "scores": plan.scores.tolist(),
            "actions": plan.actions.tolist(),
        }
    return result


def margins(plans: dict) -> dict:
    """Per plan, per token (E, B, H, T): the largest of `NOISE_SCALES` up to which no noise
    draw changed it, or 0 where the smallest already did."""
    unchanged = {name: [] for name in plans}  # per scale: (E, B, H, T) bool
    for scale in NOISE_SCALES:
        noisy = [golden((scale, seed)) for seed in range(NOISE_DIRECTIONS)]
        for name, plan in plans.items():
            same = [np.equal(draw[name]["tokens"], plan["tokens"]) for draw in noisy]
            unchanged[name].append(np.logical_and.reduce(same))
    result = {}
    for name, per_scale in unchanged.items():
        stable = np.logical_and.accumulate(per_scale)  # unchanged at this scale and below
        margin = np.zeros(stable.shape[1:])
        for scale, holds in zip(NOISE_SCALES, stable, strict=True):
            margin[holds] = scale
        result[name] = margin.tolist()
    return result


@pytest.mark.parametrize("name", ["greedy", "sampled"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "pytorch"])
def test_plans_equal_the_pinned_ones(name: str, native: bool) -> None:
    """Both decode paths on the CPU: the native kernels and the PyTorch modules."""
    expected = json.loads(GOLDEN.read_text())[name]
    compared = np.array(expected["margins"]) >= MARGIN  # (E, B, H, T)
    assert compared.mean() >= MIN_COMPARED, (
        f"the golden file lets the test compare only {compared.mean():.0%} of the tokens; "
        "rewrite it on a model whose plans have larger margins"
    )
    with native_kernels(native):
        plan = golden()[name]
    tokens, pinned = np.array(plan["tokens"]), np.array(expected["tokens"])
    np.testing.assert_array_equal(tokens[compared], pinned[compared])
    whole = compared.all(axis=(2, 3))  # (E, B): beams whose every token is compared
    scores, pinned_scores = np.array(plan["scores"]), np.array(expected["scores"])
    np.testing.assert_allclose(scores[whole], pinned_scores[whole], rtol=1e-4, atol=1e-6)
    best = pinned_scores.argmax(axis=1)  # (E,)
    envs = whole[np.arange(len(best)), best]
    actions, pinned_actions = np.array(plan["actions"]), np.array(expected["actions"])
    np.testing.assert_allclose(actions[envs], pinned_actions[envs], rtol=1e-4, atol=1e-6)


if __name__ == "__main__":  # python tests/planning/test_golden_plan.py rewrites the file
    plans = golden()
    for name, margin in margins(plans).items():
        plans[name]["margins"] = margin
    GOLDEN.write_text(json.dumps(plans) + "\n")
