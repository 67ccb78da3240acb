"""scripts/imitation_probe.py: its imitators learn a linear law, from real inputs, with every
kind of output it compares."""

import imitation_probe as probe
import numpy as np
import pytest
import torch


@pytest.mark.parametrize(
    "output, bins, sigma, decoding",
    [
        ("regression", "", 0.0, "regression"),
        ("categorical", "uniform", 1.0, "mean"),
        ("categorical", "uniform", 1.0, "most likely"),
        ("categorical", "uniform", 0.0, "most likely"),
    ],
)
def test_an_imitator_learns_a_linear_law_from_real_inputs(output, bins, sigma, decoding):
    rng = np.random.default_rng(0)
    observations = rng.normal(size=(4000, 3)).astype(np.float32)
    law = np.array([[0.3], [-0.2], [0.1]], np.float32)
    actions = np.clip(observations @ law, -1, 1).astype(np.float32)
    variant = probe.Variant("real", output, bins, sigma, steps=250, learning_rate=3e-3)
    act = probe.train(variant, observations, actions, seed=0)
    test = rng.normal(size=(200, 3)).astype(np.float32)
    got = act(test, torch.Generator().manual_seed(0))[decoding]
    expected = np.clip(test @ law, -1, 1)
    # 100 uniform bins over about [-1, 1] are 0.02 wide: within a few bins of the law.
    assert np.abs(got - expected).mean() < 0.05
    assert got.shape == expected.shape
