"""Sampling filters: top-k keeps k, cdf keeps the minimal mass set, greedy is argmax."""

from __future__ import annotations

import pytest
import torch

from trajectory_transformer.planning.sampling import (
    filter_cdf,
    filter_logits,
    filter_top_k,
    sample_categorical,
    sample_tokens,
)


def test_top_k_keeps_exactly_the_k_largest() -> None:
    logits = torch.tensor([[0.1, 3.0, -1.0, 2.0, 2.5], [5.0, 4.0, 3.0, 2.0, 1.0]])
    out = filter_top_k(logits, 2)
    assert torch.isfinite(out).sum(dim=-1).tolist() == [2, 2]
    assert torch.isfinite(out[0]).tolist() == [False, True, False, False, True]
    assert torch.equal(out[torch.isfinite(out)], torch.tensor([3.0, 2.5, 5.0, 4.0]))
    assert filter_top_k(logits, 5) is logits
    with pytest.raises(ValueError, match="k >= 1"):
        filter_top_k(logits, 0)


def test_cdf_keeps_the_smallest_set_reaching_the_mass() -> None:
    probs = torch.tensor([[0.05, 0.5, 0.1, 0.25, 0.1]])
    logits = probs.log()
    # 0.5 < 0.6, 0.5 + 0.25 >= 0.6: the two most likely tokens.
    assert torch.isfinite(filter_cdf(logits, 0.6)).tolist() == [[False, True, False, True, False]]
    # Reaching the mass exactly is enough.
    assert torch.isfinite(filter_cdf(logits, 0.75)).sum().item() == 2
    assert torch.isfinite(filter_cdf(logits, 0.5)).sum().item() == 1
    # A tiny cdf still keeps the most likely token; cdf 1 keeps everything.
    assert torch.isfinite(filter_cdf(logits, 1e-6)).tolist() == [[False, True, False, False, False]]
    assert torch.isfinite(filter_cdf(logits, 1.0)).all()
    with pytest.raises(ValueError, match="cdf"):
        filter_cdf(logits, 0.0)


def test_cdf_then_top_k_and_temperature() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0]])
    out = filter_logits(logits, temperature=2.0, top_k=2, cdf=None)
    assert torch.allclose(out[0, :2], logits[0, :2] / 2)
    assert torch.isinf(out[0, 2:]).all()
    with pytest.raises(ValueError, match="temperature"):
        filter_logits(logits, temperature=0.0)


def test_deterministic_is_argmax_and_draws_nothing() -> None:
    logits = torch.randn(64, 11, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    state = g.get_state()
    tokens = sample_tokens(logits, g, top_k=3, cdf=0.2, deterministic=True)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert torch.equal(g.get_state(), state)


def test_top_1_is_argmax_and_draws_nothing() -> None:
    logits = torch.randn(64, 11, generator=torch.Generator().manual_seed(0))
    g = torch.Generator().manual_seed(1)
    state = g.get_state()
    tokens = sample_tokens(logits, g, temperature=0.5, top_k=1, cdf=0.3)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    assert torch.equal(g.get_state(), state)


def test_sampling_follows_the_distribution_and_the_seed() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7, 0.0])
    logits = probs.log().expand(20000, 4)
    draws = sample_categorical(logits, torch.Generator().manual_seed(0))
    freq = torch.bincount(draws, minlength=4).float() / draws.numel()
    assert torch.allclose(freq, probs, atol=0.015)
    assert freq[3] == 0
    again = sample_categorical(logits, torch.Generator().manual_seed(0))
    other = sample_categorical(logits, torch.Generator().manual_seed(1))
    assert torch.equal(draws, again) and not torch.equal(draws, other)


def test_filtered_sampling_stays_in_the_kept_set() -> None:
    logits = torch.randn(500, 11, generator=torch.Generator().manual_seed(2))
    g = torch.Generator().manual_seed(3)
    tokens = sample_tokens(logits, g, top_k=3)
    top3 = logits.topk(3, dim=-1).indices
    assert (tokens[:, None] == top3).any(dim=-1).all()
    tokens = sample_tokens(logits, g, cdf=0.6)
    kept = torch.isfinite(filter_cdf(logits, 0.6))
    assert kept.gather(1, tokens[:, None]).all()
