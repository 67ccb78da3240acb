"""Diagnostics against plain references: prefix-by-prefix forwards, explicit loops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.checkpoint import load_checkpoint
from trajectory_transformer.data.discretizer import Discretizer
from trajectory_transformer.data.windows import TokenWindows
from trajectory_transformer.diagnostics import (
    attention_maps,
    compounding_error,
    dataset_tokens,
    dimension_names,
    plan_distributions,
    sample_windows,
    token_accuracy,
    value_targets_of,
)
from trajectory_transformer.evaluation import PlanSnapshot
from trajectory_transformer.planning import BeamPlanner, Plan


def scaled_model(obs: int = 3, act: int = 2, n_bins: int = 9, transitions: int = 4, seed=0):
    model = tiny_gpt(obs, act, n_bins, transitions, seed)
    with torch.no_grad():  # sharper distributions than the init, so that tokens differ
        for p in model.parameters():
            p.mul_(6.0)
    return model


def random_windows(model, count: int, seed: int = 0) -> torch.Tensor:
    c = model.config
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, c.n_bins, (count, c.block_size), generator=generator)


def test_plan_distributions_reproduce_the_cached_planners_expectations():
    model = scaled_model()
    data = np.random.default_rng(0).normal(size=(400, model.config.transition_dim))
    discretizer = Discretizer.fit(data, n_bins=9)
    planner = BeamPlanner(
        model, discretizer, beam_width=3, horizon=2, context_transitions=2, temperature=1.5
    )
    planner.reset(2)
    rng = np.random.default_rng(1)
    for _ in range(3):  # build a context of real transitions
        planner.act(rng.normal(size=(2, 3)))
        planner.observe(rng.normal(size=2), np.zeros(2, dtype=bool))
    observations = rng.normal(size=(2, 3))
    plan = planner.plan(observations)
    snapshot = PlanSnapshot(
        step=3,
        context=planner.context_tokens(observations)[0],
        plan=Plan(**{name: value[:1] for name, value in vars(plan).items()}),
    )
    distributions = plan_distributions(model, snapshot, temperature=1.5)
    best = snapshot.best
    reward = torch.as_tensor(distributions.rewards) @ discretizer.values[-2]
    value = torch.as_tensor(distributions.values) @ discretizer.values[-1]
    torch.testing.assert_close(reward, plan.rewards[0, best], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(value, plan.values[0, best], atol=1e-5, rtol=1e-5)


def test_attention_maps_are_the_masked_probabilities_the_model_uses():
    model = scaled_model()
    tokens = random_windows(model, 1)[0][:20]
    maps = attention_maps(model, tokens)  # (layers, heads, S, S)
    assert maps.shape == (2, 2, 20, 20)
    torch.testing.assert_close(maps.sum(dim=-1), torch.ones(2, 2, 20))
    assert (maps[..., ~model.mask[:20, :20]] == 0).all()
    # A value token (position 6) is seen by itself only.
    assert (maps[..., 7:, 6] == 0).all() and (maps[..., 6, 6] > 0).all()
    # Applied to the values, the maps give what the attention layers computed with SDPA.
    values, outputs = [], []
    hooks = []
    for block in model.blocks:
        hooks.append(block.attn.c_attn.register_forward_hook(lambda m, i, o: values.append(o)))
        hooks.append(block.attn.c_proj.register_forward_pre_hook(lambda m, i: outputs.append(i[0])))
    with torch.no_grad():
        model(tokens[None])
    for hook in hooks:
        hook.remove()
    for layer, (qkv, output) in enumerate(zip(values, outputs, strict=True)):
        v = qkv[0, :, 32:].reshape(20, 2, 8).transpose(0, 1)  # (heads, S, hs)
        expected = (maps[layer] @ v).transpose(0, 1).reshape(20, 16)
        torch.testing.assert_close(expected, output[0], atol=1e-5, rtol=1e-5)


def test_token_accuracy_matches_prefix_by_prefix_predictions():
    model = scaled_model()
    windows = random_windows(model, 5)
    accuracy = token_accuracy(model, windows, batch_size=2)
    T = model.config.transition_dim
    hits, near, counts = np.zeros(T), np.zeros(T), np.zeros(T)
    with torch.no_grad():
        for window in windows:
            for i in range(1, len(window)):
                predicted = model(window[None, :i])[0, -1].argmax()
                hits[i % T] += predicted == window[i]
                near[i % T] += abs(int(predicted) - int(window[i])) <= 1
                counts[i % T] += 1
    np.testing.assert_allclose(accuracy.top1, hits / counts, rtol=1e-6)
    np.testing.assert_allclose(accuracy.within_one, near / counts, rtol=1e-6)
    assert accuracy.tokens == counts.min()


def test_compounding_error_starts_at_the_one_step_error():
    # With one observation dimension, the first imagined observation has the true past, so
    # its error is the one-step error; later ones are conditioned on imagined tokens.
    model = scaled_model(obs=1, act=1, n_bins=9, transitions=5)
    data = np.random.default_rng(0).normal(size=(300, model.config.transition_dim))
    discretizer = Discretizer.fit(data, n_bins=9)
    windows = random_windows(model, 16)
    error = compounding_error(model, discretizer, windows, context_transitions=2)
    assert error.depth.tolist() == [1, 2, 3]
    assert error.imagined_observation[0] == pytest.approx(error.one_step_observation[0])
    assert not np.allclose(error.imagined_observation, error.one_step_observation)
    with pytest.raises(ValueError, match="context_transitions must be in"):
        compounding_error(model, discretizer, windows, context_transitions=5)


def test_compounding_error_feeds_the_true_actions():
    model = scaled_model(obs=2, act=2, transitions=3)
    discretizer = Discretizer.fit(np.random.default_rng(0).normal(size=(300, 6)), n_bins=9)
    windows = random_windows(model, 4)
    changed = windows.clone()
    changed[:, 6 + 2 : 6 + 4] = (changed[:, 6 + 2 : 6 + 4] + 3) % 9  # other actions at t=1
    same = compounding_error(model, discretizer, windows, 1)
    other = compounding_error(model, discretizer, changed, 1)
    assert same.imagined_observation[0] == pytest.approx(other.imagined_observation[0])
    assert not np.allclose(same.imagined_observation[1:], other.imagined_observation[1:])


def test_sample_windows_skips_windows_that_run_past_an_episode():
    rng = np.random.default_rng(0)
    lengths = np.array([3, 5])
    transitions = rng.normal(size=(8, 5)).astype(np.float32)
    discretizer = Discretizer.fit(transitions, n_bins=4)
    windows = TokenWindows(transitions, lengths, discretizer, sequence_transitions=4)
    sample = sample_windows(windows, 10)
    tokens = discretizer.encode(torch.as_tensor(transitions))
    assert len(sample) == 2  # starts 0 and 1 of the second episode
    expected = {tuple(tokens[3 + s : 7 + s].reshape(-1).tolist()) for s in (0, 1)}
    assert {tuple(row.tolist()) for row in sample} == expected
    short = TokenWindows(transitions[:3], lengths[:1], discretizer, sequence_transitions=4)
    with pytest.raises(ValueError, match="no episode is 4 transitions long"):
        sample_windows(short, 10)


def test_dataset_tokens_rebuild_what_the_checkpoint_was_trained_on(tiny_checkpoint):
    checkpoint = load_checkpoint(tiny_checkpoint)
    transitions, windows = dataset_tokens(checkpoint)
    assert transitions.shape[1] == 3 + 1 + 2 and windows.sequence_transitions == 4
    assert value_targets_of(checkpoint.config) == (0.99, -100.0)
    assert value_targets_of({"dataset": {"discount": 0.9, "terminal_penalty": 0.0}}) == (0.9, 0.0)


def test_dimension_names():
    assert dimension_names(3, 1, "Pendulum-v1")[:4] == [
        "cos θ",
        "sin θ",
        "θ̇ (rad/s)",
        "torque (N·m)",
    ]
    assert dimension_names(2, 1, "Other-v0") == ["obs 0", "obs 1", "act 0", "reward", "value"]
    assert dimension_names(2, 1, "Pendulum-v1")[0] == "obs 0"  # shape differs: generic


def test_diagnostics_leave_a_training_model_in_training_mode():
    model = scaled_model().train()
    token_accuracy(model, random_windows(model, 2))
    assert model.training
