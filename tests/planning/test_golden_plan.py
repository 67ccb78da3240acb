"""A small plan pinned to fixed numbers: refactors of the planner, the model or the cache must
leave greedy and sampled plans unchanged for the same seed.

`golden_plan.json` was written by this file's `golden()` on the code it pins; rewrite it only
for a change that is meant to alter plans, and say so.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.model.native import native_kernels
from trajectory_transformer.planning import BeamPlanner

GOLDEN = Path(__file__).with_name("golden_plan.json")
OBS, ACT, N = 3, 2, 13
T = OBS + ACT + 2
SETTINGS = dict(horizon=3, beam_width=4, n_expand=2, context_transitions=2, cdf_act=0.9, k_obs=2)


def golden() -> dict:
    """Plans of a seeded tiny model for three envs with mixed histories, greedy and sampled."""
    model = tiny_gpt(OBS, ACT, N, sequence_transitions=6, seed=11)
    with torch.no_grad():  # larger weights than the init, so that beams and tokens differ
        for p in model.parameters():
            p.mul_(6.0)
    data = np.random.default_rng(11).normal(size=(600, T))
    discretizer = Discretizer.fit(data, N, "quantile")
    result = {}
    for name, deterministic in (("greedy", True), ("sampled", False)):
        planner = BeamPlanner(model, discretizer, deterministic=deterministic, seed=5, **SETTINGS)
        planner.reset(3)
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


@pytest.mark.parametrize("name", ["greedy", "sampled"])
@pytest.mark.parametrize("native", [True, False], ids=["native", "pytorch"])
def test_plans_equal_the_pinned_ones(name: str, native: bool) -> None:
    """Both decode paths on the CPU: the native kernels and the PyTorch modules."""
    expected = json.loads(GOLDEN.read_text())[name]
    with native_kernels(native):
        plan = golden()[name]
    assert plan["tokens"] == expected["tokens"]
    np.testing.assert_allclose(plan["scores"], expected["scores"], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(plan["actions"], expected["actions"], rtol=1e-5, atol=1e-6)


if __name__ == "__main__":  # python tests/planning/test_golden_plan.py rewrites the file
    GOLDEN.write_text(json.dumps(golden()) + "\n")
