"""TrajectoryGPT: mask semantics, cached paths equal the full forward, heads, optimiser."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from conftest import tiny_gpt

from trajectory_transformer.model import GPTConfig, TrajectoryGPT, trajectory_attention_mask

OBS, ACT, N = 3, 2, 7
T = OBS + ACT + 2


def tiny_model(seed: int = 0, sequence_transitions: int = 3) -> TrajectoryGPT:
    model = tiny_gpt(OBS, ACT, N, sequence_transitions, seed)
    # Random biases and norms, so a test cannot pass because something is still zero.
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def random_tokens(model: TrajectoryGPT, rows: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, N, (rows, model.config.block_size), generator=g)


def test_config_properties_and_validation() -> None:
    config = tiny_model().config
    assert config.transition_dim == T
    assert config.block_size == 3 * T
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(observation_dim=3, action_dim=1, n_bins=5, n_head=3, embedding_dim=16)
    with pytest.raises(ValueError, match="positive"):
        GPTConfig(observation_dim=0, action_dim=1, n_bins=5)


@pytest.mark.parametrize("value_sees_itself", [True, False])
def test_mask_matches_double_loop(value_sees_itself: bool) -> None:
    for length, transition_dim in [(21, 7), (12, 4), (5, 3)]:
        expected = torch.zeros(length, length, dtype=torch.bool)
        for q in range(length):
            for k in range(length):
                is_value = k % transition_dim == transition_dim - 1
                hidden = is_value and (k < q or not value_sees_itself)
                expected[q, k] = k <= q and not hidden
        mask = trajectory_attention_mask(length, transition_dim, value_sees_itself)
        assert torch.equal(mask, expected)


def test_forward_shape_and_block_size_error() -> None:
    model = tiny_model()
    tokens = random_tokens(model)
    assert model(tokens).shape == (3, model.config.block_size, N)
    assert model(tokens[:, :5]).shape == (3, 5, N)
    too_long = torch.zeros(1, model.config.block_size + 1, dtype=torch.long)
    with pytest.raises(ValueError, match="block size"):
        model(too_long)


@torch.no_grad()
def test_decode_token_by_token_matches_forward() -> None:
    model = tiny_model()
    tokens = random_tokens(model)
    expected = model(tokens)
    cache = model.new_cache(rows=3)
    for position in range(tokens.shape[1]):
        logits = model.decode_step(tokens[:, position], cache, position)
        torch.testing.assert_close(logits, expected[:, position], atol=1e-5, rtol=0)


# 1: mid-observation, T-1: ends on a value token, T: a whole transition, 2T-1: a later value.
@pytest.mark.parametrize("prefix", [1, 4, T - 1, T, T + 3, 2 * T - 1, 2 * T])
@torch.no_grad()
def test_prefill_then_decode_matches_forward(prefix: int) -> None:
    model = tiny_model()
    tokens = random_tokens(model)
    expected = model(tokens)
    cache = model.new_cache(rows=3)
    prefilled = model.prefill(tokens[:, :prefix], cache)
    torch.testing.assert_close(prefilled, expected[:, :prefix], atol=1e-5, rtol=0)
    for position in range(prefix, tokens.shape[1]):
        logits = model.decode_step(tokens[:, position], cache, position)
        torch.testing.assert_close(logits, expected[:, position], atol=1e-5, rtol=0)


@torch.no_grad()
def test_prefill_in_chunks_matches_forward() -> None:
    model = tiny_model()
    tokens = random_tokens(model)
    expected = model(tokens)
    cache = model.new_cache(rows=3)
    bounds = [0, 2, T - 1, T + 4, 2 * T + 1, tokens.shape[1]]  # chunks straddle transitions
    for start, end in itertools.pairwise(bounds):
        logits = model.prefill(tokens[:, start:end], cache, start=start)
        torch.testing.assert_close(logits, expected[:, start:end], atol=1e-5, rtol=0)


def cached_logits(model: TrajectoryGPT, tokens: torch.Tensor) -> torch.Tensor:
    """All logits through the cache: prefill one transition, decode the rest."""
    cache = model.new_cache(rows=tokens.shape[0])
    head = model.prefill(tokens[:, :T], cache)
    rest = [model.decode_step(tokens[:, p], cache, p) for p in range(T, tokens.shape[1])]
    return torch.cat([head, torch.stack(rest, dim=1)], dim=1)


@pytest.mark.parametrize("value_sees_itself", [True, False])
@pytest.mark.parametrize("path", ["forward", "cached"])
@torch.no_grad()
def test_earlier_value_token_is_hidden(path: str, value_sees_itself: bool) -> None:
    model = with_value_mask(tiny_model(), value_sees_itself)
    run = model if path == "forward" else lambda t: cached_logits(model, t)
    tokens = random_tokens(model)
    value_position = T - 1  # the first transition's value token
    changed = tokens.clone()
    changed[:, value_position] = (tokens[:, value_position] + 1) % N
    before, after = run(tokens), run(changed)
    # Its own logits (predicting the next observation) see it, through the residual stream
    # whatever the mask...
    assert not torch.allclose(before[:, value_position], after[:, value_position])
    # ...no later position does, and earlier ones cannot.
    torch.testing.assert_close(before[:, value_position + 1 :], after[:, value_position + 1 :])
    torch.testing.assert_close(before[:, :value_position], after[:, :value_position])

    # A non-value token (the first transition's reward) is seen by every later position.
    reward_position = T - 2
    changed = tokens.clone()
    changed[:, reward_position] = (tokens[:, reward_position] + 1) % N
    after = run(changed)
    for position in range(reward_position, tokens.shape[1]):
        assert not torch.allclose(before[:, position], after[:, position]), position


def with_value_mask(model: TrajectoryGPT, value_sees_itself: bool) -> TrajectoryGPT:
    """The same weights under the chosen mask of value tokens."""
    masked = TrajectoryGPT(replace(model.config, value_sees_itself=value_sees_itself))
    masked.load_state_dict(model.state_dict())
    return masked.eval()


@pytest.mark.parametrize("path", ["forward", "cached"])
@torch.no_grad()
def test_the_originals_mask_changes_only_the_value_positions(path: str) -> None:
    """Hiding the value column from the value token itself (the original code) changes what
    the value positions compute, and nothing else."""
    ours = tiny_model()
    original = with_value_mask(ours, value_sees_itself=False)
    tokens = random_tokens(ours)
    if path == "forward":
        a, b = ours(tokens), original(tokens)
    else:
        a, b = cached_logits(ours, tokens), cached_logits(original, tokens)
        torch.testing.assert_close(b, original(tokens))  # the cache keeps the mask
    values = torch.arange(tokens.shape[1]) % T == T - 1
    torch.testing.assert_close(a[:, ~values], b[:, ~values])
    assert not torch.allclose(a[:, values], b[:, values])


@torch.no_grad()
def test_position_uses_head_of_its_dimension() -> None:
    model = tiny_model()
    tokens = random_tokens(model)
    for dim in range(T):
        with torch.no_grad():
            original = model.head_weight.clone(), model.head_bias.clone()
            keep = torch.zeros(T, 1, 1)
            keep[dim] = 1.0
            model.head_weight.mul_(keep)
            model.head_bias.mul_(keep[:, 0])
        logits = model(tokens)
        nonzero = logits.abs().amax(dim=(0, 2)) > 0  # (S,)
        positions = torch.arange(tokens.shape[1])
        assert torch.equal(nonzero, positions % T == dim)
        # The single-token decode path picks the same head.
        cache = model.new_cache(rows=3)
        if dim > 0:
            model.prefill(tokens[:, :dim], cache)
        step = model.decode_step(tokens[:, dim], cache, dim)
        torch.testing.assert_close(step, logits[:, dim], atol=1e-5, rtol=0)
        model.head_weight.copy_(original[0])
        model.head_bias.copy_(original[1])


def test_configure_optimizer_groups() -> None:
    model = tiny_model()
    optimizer = model.configure_optimizer(learning_rate=1e-3, weight_decay=0.1, betas=(0.9, 0.95))
    decay, no_decay = optimizer.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    names = {id(p): name for name, p in model.named_parameters()}
    decay_names = {names[id(p)] for p in decay["params"]}
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert not decay_names & no_decay_names
    assert decay_names | no_decay_names == set(names.values())
    assert "head_weight" in decay_names
    for name in ["tok_emb.weight", "pos_emb.weight", "ln_f.weight", "ln_f.bias", "head_bias"]:
        assert name in no_decay_names
    assert all(n.endswith("weight") and "ln" not in n and "emb" not in n for n in decay_names)
    assert all(n.endswith("bias") or "ln" in n or "emb" in n for n in no_decay_names)


def test_training_step_reduces_loss() -> None:
    model = tiny_model()
    model.train()
    tokens = random_tokens(model, rows=4)
    optimizer = model.configure_optimizer(learning_rate=1e-2, weight_decay=0.1, betas=(0.9, 0.95))
    losses = []
    for _ in range(20):
        logits = model(tokens[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, N), tokens[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0]


@pytest.mark.parametrize("n_layer, width", [(3, 64), (4, 128)])
def test_parameters_are_the_architectures_count(n_layer: int, width: int) -> None:
    """Counted from the architecture: embeddings, 12 d^2 + 13 d per block, final norm, heads."""
    O, A, N, L = 3, 1, 100, 10  # noqa: E741
    T = O + A + 2
    config = GPTConfig(O, A, N, L, n_layer=n_layer, n_head=4, embedding_dim=width)
    d = width
    embeddings = T * N * d + L * T * d
    blocks = n_layer * (12 * d * d + 13 * d)
    heads = T * d * N + T * N
    assert TrajectoryGPT(config).num_parameters() == embeddings + blocks + 2 * d + heads
    if (n_layer, width) == (3, 64):
        assert TrajectoryGPT(config).num_parameters() == 231_320  # what tt-train prints
