"""KVCache: in-place updates, and reorder_ (beam selection) equals re-indexing the tokens."""

from __future__ import annotations

import pytest
import torch
from conftest import tiny_gpt, tolerance

from trajectory_transformer.model import KVCache, TrajectoryGPT
from trajectory_transformer.model.kv_cache import gather_rows_

OBS, ACT, N = 3, 2, 7
T = OBS + ACT + 2


def tiny_model() -> TrajectoryGPT:
    return tiny_gpt(OBS, ACT, N, sequence_transitions=3)


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
def test_reorder_then_decode_matches_forward_of_reindexed_tokens(prefix: int, device) -> None:
    model = tiny_model().to(device)
    g = torch.Generator().manual_seed(3)
    rows, capacity = 3, 8
    tokens = torch.randint(0, N, (rows, model.config.block_size), generator=g).to(device)
    cache = model.new_cache(rows=capacity)
    model.prefill(tokens[:, :prefix], cache)
    # Broadcast 3 context rows to 8 beams, then select among the beams twice more.
    parents = [
        torch.randint(0, rows, (capacity,), generator=g).to(device),
        torch.randint(0, capacity, (capacity,), generator=g).to(device),
        torch.randint(0, capacity, (5,), generator=g).to(device),
    ]
    position = prefix
    for parent in parents:
        cache.reorder_(parent, length=position)
        # Each beam keeps its parent's prefix and continues with its own random tokens.
        tokens = tokens[parent].clone()  # (R', S)
        new = torch.randint(0, N, tokens[:, position:].shape, generator=g)
        tokens[:, position:] = new.to(device)
        for _ in range(3):
            logits = model.decode_step(tokens[:, position], cache, position)
            expected = model(tokens[:, : position + 1])[:, position]
            torch.testing.assert_close(logits, expected, **tolerance(device))
            position += 1


def test_reorder_rejects_too_many_rows() -> None:
    cache = KVCache(n_layer=1, rows=2, n_head=1, max_len=4, head_dim=2)
    with pytest.raises(ValueError, match="exceeds"):
        cache.reorder_(torch.zeros(3, dtype=torch.long), length=2)


def test_repeat_rows_equals_reorder_by_repeated_rows() -> None:
    g = torch.Generator().manual_seed(4)
    cache = KVCache(n_layer=2, rows=7, n_head=2, max_len=6, head_dim=3)
    cache.keys.copy_(torch.randn(cache.keys.shape, generator=g))
    cache.values.copy_(torch.randn(cache.values.shape, generator=g))
    expected = KVCache(n_layer=2, rows=7, n_head=2, max_len=6, head_dim=3)
    expected.keys.copy_(cache.keys)
    expected.values.copy_(cache.values)
    cache.repeat_rows_(rows=2, copies=3, length=5, start=1)
    expected.reorder_(torch.arange(2).repeat(3), length=5, start=1)
    assert torch.equal(cache.keys, expected.keys) and torch.equal(cache.values, expected.values)
    with pytest.raises(ValueError, match="exceeds"):
        cache.repeat_rows_(rows=2, copies=4, length=5)


@pytest.mark.parametrize("by_layer", [True, False])
def test_gather_rows_layer_by_layer_or_at_once_equals_indexing(by_layer: bool) -> None:
    """The CPU's layer-by-layer gather and the other devices' single gather are one result:
    the rows re-indexed over [start, length), every other position and row untouched."""
    g = torch.Generator().manual_seed(5)
    buf = torch.randn(3, 6, 2, 5, 4, generator=g)  # (L, R, nh, M, hs)
    parent = torch.tensor([4, 4, 0, 5])  # overlapping sources and targets, a repeat
    expected = buf.clone()
    expected[:, :4, :, 1:4] = buf[:, parent, :, 1:4]
    gather_rows_(buf, parent, start=1, length=4, by_layer=by_layer)
    assert torch.equal(buf, expected)


@torch.no_grad()
def test_shared_prefix_repeat_rows_moves_only_own_positions() -> None:
    model = tiny_model()
    cache = model.new_shared_prefix_cache(2, 3, 12, prefix_len=T, own_len=T)
    g = torch.Generator().manual_seed(5)
    model.prefill(torch.randint(0, N, (2, T), generator=g), cache)
    model.prefill(torch.randint(0, N, (12, 2), generator=g), cache, start=T)
    prefix_keys, own_keys = cache.prefix.keys.clone(), cache.own.keys.clone()
    cache.repeat_rows_(6, 2, T + 2)
    assert torch.equal(cache.prefix.keys, prefix_keys)
    assert torch.equal(cache.own.keys[:, 6:, :, :2], own_keys[:, :6, :, :2])
    assert torch.equal(cache.own.keys[:, :6], own_keys[:, :6])
    with pytest.raises(ValueError, match="whole groups"):
        cache.repeat_rows_(4, 2, T + 2)


def grouped_tokens(g: torch.Generator, groups: int, members: int, copies: int, prefix: int):
    """Random full sequences for rows ordered (copy, group, member), sharing a prefix per group."""
    model_len = 3 * T
    context = torch.randint(0, N, (groups, prefix), generator=g)
    rows = copies * groups * members
    tokens = torch.randint(0, N, (rows, model_len), generator=g)
    group_of_row = (torch.arange(rows) // members) % groups
    tokens[:, :prefix] = context[group_of_row]
    return context, tokens, group_of_row


@pytest.mark.parametrize("prefix", [1, T - 1, T, T + 3])
@torch.no_grad()
def test_shared_prefix_decode_matches_forward_of_concatenated_sequences(
    prefix: int, device
) -> None:
    model = tiny_model().to(device)
    g = torch.Generator().manual_seed(prefix)
    groups, members, copies = 3, 2, 2
    context, tokens, _ = grouped_tokens(g, groups, members, copies, prefix)
    context, tokens = context.to(device), tokens.to(device)
    cache = model.new_shared_prefix_cache(
        prefix_rows=4, rows_per_prefix=members, rows=16, prefix_len=T + 3, own_len=3 * T - prefix
    )
    model.prefill(context, cache)
    assert cache.prefix_length == prefix and cache.groups == groups
    expected = model(tokens)
    for position in range(prefix, 3 * T):  # crosses value tokens of the plan and of the prefix
        # All copies first, then only the first copy (a prefix of the rows), as the planner does.
        rows = tokens.shape[0] if position < 2 * T else groups * members
        logits = model.decode_step(tokens[:rows, position], cache, position)
        torch.testing.assert_close(logits, expected[:rows, position], **tolerance(device))


@torch.no_grad()
def test_shared_prefix_prefill_after_the_prefix_matches_forward() -> None:
    model = tiny_model()
    g = torch.Generator().manual_seed(1)
    context, tokens, _ = grouped_tokens(g, groups=2, members=3, copies=1, prefix=T + 1)
    cache = model.new_shared_prefix_cache(2, 3, 6, prefix_len=T + 1, own_len=2 * T - 1)
    model.prefill(context, cache)
    logits = model.prefill(tokens[:, T + 1 : 2 * T + 4], cache, start=T + 1)  # several tokens
    torch.testing.assert_close(logits, model(tokens[:, : 2 * T + 4])[:, T + 1 :], atol=1e-5, rtol=0)
    # The shared prefix holds the same keys and values as a plain cache of the context.
    plain = model.new_cache(rows=2)
    model.prefill(context, plain)
    torch.testing.assert_close(cache.prefix.keys[:, :, :, : T + 1], plain.keys[:, :, :, : T + 1])
    torch.testing.assert_close(
        cache.prefix.values[:, :, :, : T + 1], plain.values[:, :, :, : T + 1]
    )


@torch.no_grad()
def test_shared_prefix_reorder_moves_only_own_positions_within_groups() -> None:
    model = tiny_model()
    g = torch.Generator().manual_seed(2)
    groups, members, prefix = 2, 4, T - 2
    context, tokens, _ = grouped_tokens(g, groups, members, copies=1, prefix=prefix)
    cache = model.new_shared_prefix_cache(groups, members, 8, prefix_len=prefix, own_len=2 * T)
    model.prefill(context, cache)
    position = prefix
    for step in range(3):
        # Beam selection: each row takes a random parent of its own group.
        member = torch.randint(0, members, (groups * members,), generator=g)
        parent = torch.arange(groups).repeat_interleave(members) * members + member
        prefix_keys = cache.prefix.keys.clone()
        own_keys = cache.own.keys.clone()
        cache.reorder_(parent, position)
        assert torch.equal(cache.prefix.keys, prefix_keys)  # the shared part never moves
        own = position - prefix
        assert torch.equal(cache.own.keys[:, :, :, :own], own_keys[:, parent, :, :own])
        assert torch.equal(cache.own.keys[:, :, :, own:], own_keys[:, :, :, own:])
        tokens = tokens[parent].clone()
        tokens[:, position:] = torch.randint(0, N, tokens[:, position:].shape, generator=g)
        for _ in range(2 + step):
            logits = model.decode_step(tokens[:, position], cache, position)
            expected = model(tokens[:, : position + 1])[:, position]
            torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
            position += 1


def test_shared_prefix_rejects_misuse() -> None:
    model = tiny_model()
    cache = model.new_shared_prefix_cache(2, 3, 6, prefix_len=T, own_len=T)
    k = torch.zeros(6, 2, 1, 8)
    with pytest.raises(ValueError, match="write the prefix first"):
        cache.extend(0, 3, k, k)
    cache.update(0, 0, torch.zeros(2, 2, 4, 8), torch.zeros(2, 2, 4, 8))
    with pytest.raises(ValueError, match="not after the shared prefix"):
        cache.extend(0, 3, k, k)
    with pytest.raises(ValueError, match="whole copies"):
        cache.extend(0, 4, k[:4], k[:4])
    with pytest.raises(ValueError, match="from position 0"):
        cache.update(0, 1, k, k)
    with pytest.raises(ValueError, match="shared prefix"):
        cache.reorder_(torch.zeros(6, dtype=torch.long), length=6, start=2)
    with pytest.raises(ValueError, match="rows_per_prefix"):
        model.new_shared_prefix_cache(2, 3, 5, prefix_len=T, own_len=T)
    with pytest.raises(ValueError, match="block size"):
        model.new_shared_prefix_cache(1, 1, 1, prefix_len=T, own_len=model.config.block_size + 1)
