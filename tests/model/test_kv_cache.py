"""KVCache: in-place updates, and reorder_ (beam selection) equals re-indexing the tokens."""

from __future__ import annotations

import pytest
import torch

from trajectory_transformer.model import GPTConfig, KVCache, TrajectoryGPT

OBS, ACT, N = 3, 2, 7
T = OBS + ACT + 2


def tiny_model() -> TrajectoryGPT:
    torch.manual_seed(0)
    config = GPTConfig(
        observation_dim=OBS,
        action_dim=ACT,
        n_bins=N,
        sequence_transitions=3,
        n_layer=2,
        n_head=2,
        embedding_dim=16,
        dropout=0.0,
    )
    return TrajectoryGPT(config).eval()


def test_update_writes_in_place_and_returns_prefix() -> None:
    cache = KVCache(n_layer=2, rows=4, n_head=2, max_len=10, head_dim=3)
    keys, values = cache.keys, cache.values
    k, v = torch.randn(2, 2, 3, 3), torch.randn(2, 2, 3, 3)
    k_all, v_all = cache.update(1, 2, k, v)
    assert k_all.shape == v_all.shape == (2, 2, 5, 3)
    assert torch.equal(k_all[:, :, 2:], k) and torch.equal(v_all[:, :, 2:], v)
    assert cache.keys is keys and cache.values is values  # no reallocation
    assert k_all.data_ptr() == keys[1].data_ptr()  # a view of the static buffer
    assert torch.count_nonzero(keys[0]) == 0 and torch.count_nonzero(keys[1, 2:]) == 0
    with pytest.raises(ValueError, match="does not fit"):
        cache.update(0, 9, k, v)


def test_new_cache_shape_and_limit() -> None:
    model = tiny_model()
    cache = model.new_cache(rows=5, max_len=2 * T)
    assert cache.rows == 5 and cache.max_len == 2 * T
    assert cache.keys.shape == (2, 5, 2, 2 * T, 8)
    assert cache.dtype == torch.float32
    with pytest.raises(ValueError, match="block size"):
        model.new_cache(rows=1, max_len=model.config.block_size + 1)


@pytest.mark.parametrize("prefix", [T - 1, T + 2])
@torch.no_grad()
def test_reorder_then_decode_matches_forward_of_reindexed_tokens(prefix: int) -> None:
    model = tiny_model()
    g = torch.Generator().manual_seed(3)
    rows, capacity = 3, 8
    tokens = torch.randint(0, N, (rows, model.config.block_size), generator=g)
    cache = model.new_cache(rows=capacity)
    model.prefill(tokens[:, :prefix], cache)
    # Broadcast 3 context rows to 8 beams, then select among the beams twice more.
    parents = [
        torch.randint(0, rows, (capacity,), generator=g),
        torch.randint(0, capacity, (capacity,), generator=g),
        torch.randint(0, capacity, (5,), generator=g),
    ]
    position = prefix
    for parent in parents:
        cache.reorder_(parent, length=position)
        # Each beam keeps its parent's prefix and continues with its own random tokens.
        tokens = tokens[parent].clone()  # (R', S)
        tokens[:, position:] = torch.randint(0, N, tokens[:, position:].shape, generator=g)
        for _ in range(3):
            logits = model.decode_step(tokens[:, position], cache, position)
            expected = model(tokens[:, : position + 1])[:, position]
            torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
            position += 1


def test_reorder_rejects_too_many_rows() -> None:
    cache = KVCache(n_layer=1, rows=2, n_head=1, max_len=4, head_dim=2)
    with pytest.raises(ValueError, match="exceeds"):
        cache.reorder_(torch.zeros(3, dtype=torch.long), length=2)
