"""Sampling filters: top-k keeps k, cdf keeps the minimal mass set, greedy is argmax; draws
from noise drawn ahead follow the filtered distribution; a transition's noise is per env."""

from __future__ import annotations

import pytest
import torch

from trajectory_transformer.planning.config import TOKEN_KINDS, PlannerConfig
from trajectory_transformer.planning.sampling import (
    MIN_TEMPERATURE,
    SearchNoise,
    exponential_noise_,
    filter_cdf,
    filter_logits,
    filter_top_k,
    sample_categorical,
    sample_tokens,
)


def noise(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return exponential_noise_(torch.empty(shape), torch.Generator().manual_seed(seed))


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
    for bad in (0.0, -1.0, MIN_TEMPERATURE / 2, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="temperature"):
            filter_logits(logits, temperature=bad)
    assert torch.isfinite(filter_logits(logits * 1e25, temperature=MIN_TEMPERATURE)).all()


def test_deterministic_and_top_1_are_argmax_and_read_no_noise() -> None:
    logits = torch.randn(64, 11, generator=torch.Generator().manual_seed(0))
    tokens = sample_tokens(logits, None, top_k=3, cdf=0.2, deterministic=True)
    assert torch.equal(tokens, logits.argmax(dim=-1))
    tokens = sample_tokens(logits, None, temperature=0.5, top_k=1, cdf=0.3)
    assert torch.equal(tokens, logits.argmax(dim=-1))


DRAWS = 40_000
TOLERANCE = 0.012
"""Largest allowed |frequency - probability| over DRAWS draws: more than 5 standard errors
(at most sqrt(0.25 / DRAWS) = 0.0025), so a correct sampler fails about once in 10^6 runs."""


def frequencies(logits: torch.Tensor, seed: int = 0, **settings: object) -> torch.Tensor:
    rows = logits.expand(DRAWS, -1)
    draws = sample_tokens(rows, noise(rows.shape, seed), **settings)
    return torch.bincount(draws, minlength=logits.shape[-1]).double() / DRAWS


def test_sampling_follows_the_distribution_and_the_seed() -> None:
    probs = torch.tensor([0.1, 0.2, 0.7, 0.0])
    freq = frequencies(probs.log())
    torch.testing.assert_close(freq, probs.double(), atol=TOLERANCE, rtol=0)
    assert freq[3] == 0
    rows = probs.log().expand(DRAWS, 4)
    draws = sample_categorical(rows, noise(rows.shape, 0))
    assert torch.equal(draws, sample_categorical(rows, noise(rows.shape, 0)))
    assert not torch.equal(draws, sample_categorical(rows, noise(rows.shape, 1)))


def test_filtered_sampling_follows_the_renormalised_distribution() -> None:
    probs = torch.tensor([0.05, 0.3, 0.1, 0.25, 0.2, 0.1])
    logits = probs.log()
    # top-3 keeps 0.3, 0.25, 0.2 (mass 0.75); cdf 0.6 keeps 0.3, 0.25, 0.2 too (0.55 < 0.6),
    # cdf 0.5 keeps 0.3, 0.25; a temperature of 2 makes the probabilities ~ sqrt(p).
    cases = [
        (dict(top_k=3), probs * torch.tensor([0, 1, 0, 1, 1, 0.0])),
        (dict(cdf=0.5), probs * torch.tensor([0, 1, 0, 1, 0, 0.0])),
        (dict(cdf=0.6, top_k=2), probs * torch.tensor([0, 1, 0, 1, 0, 0.0])),
        (dict(temperature=2.0, top_k=3), probs.sqrt() * torch.tensor([0, 1, 0, 1, 1, 0.0])),
    ]
    for seed, (settings, kept) in enumerate(cases):
        expected = (kept / kept.sum()).double()
        freq = frequencies(logits, seed, **settings)
        torch.testing.assert_close(freq, expected, atol=TOLERANCE, rtol=0, msg=str(settings))
        assert (freq[expected == 0] == 0).all()


def test_filtered_sampling_stays_in_the_kept_set() -> None:
    logits = torch.randn(500, 11, generator=torch.Generator().manual_seed(2))
    tokens = sample_tokens(logits, noise(logits.shape, 3), top_k=3)
    top3 = logits.topk(3, dim=-1).indices
    assert (tokens[:, None] == top3).any(dim=-1).all()
    tokens = sample_tokens(logits, noise(logits.shape, 4), cdf=0.6)
    kept = torch.isfinite(filter_cdf(logits, 0.6))
    assert kept.gather(1, tokens[:, None]).all()


def test_an_envs_search_noise_comes_from_its_own_stream_alone() -> None:
    sampling = {"act": {}, "reward": {}, "value": dict(deterministic=True), "obs": dict(top_k=2)}
    args = dict(action_dim=2, observation_dim=3, n_bins=5, beams=4, copies=2, transitions=3)
    alone, together = (
        SearchNoise(sampling, groups=1, **args),
        SearchNoise(sampling, groups=3, **args),
    )
    alone.draw([torch.Generator().manual_seed(7)])
    together.draw([torch.Generator().manual_seed(s) for s in (1, 7, 2)])
    assert alone.rows("value") is None  # greedy: nothing drawn
    # Per transition 2 x 8 action, 8 reward and 3 x 4 observation draws; none after the last.
    assert alone.buffer.shape == (1, 3 * 36 - 12, 5)
    seen = []
    for transition in range(3):
        kinds = [("act", 0), ("act", 1), ("reward", 0)] + [("obs", i) for i in range(3)]
        for kind, index in kinds[: 3 if transition == 2 else None]:
            rows = together.rows(kind, index, transition)  # (copy, env, beam)
            copies = 1 if kind == "obs" else 2
            assert rows.shape == (copies * 3 * 4, 5)
            env_1 = rows.view(copies, 3, 4, 5)[:, 1].reshape(-1, 5)
            assert torch.equal(env_1, alone.rows(kind, index, transition))
            seen.append(alone.rows(kind, index, transition))
    # Every draw is handed out once, in the stream's order.
    assert torch.equal(torch.cat(seen), alone.buffer[0])
    assert (together.buffer > 0).all() and torch.isfinite(together.buffer).all()


def test_token_sampling_follows_each_kinds_settings():
    settings = PlannerConfig(
        k_obs=1, k_act=None, cdf_act=0.6, reward_token="greedy", value_token="sample"
    ).token_sampling()
    assert set(settings) == set(TOKEN_KINDS)
    assert (settings["obs"]["top_k"], settings["obs"]["cdf"]) == (1, None)
    assert (settings["act"]["top_k"], settings["act"]["cdf"]) == (None, 0.6)
    assert settings["reward"]["deterministic"] and not settings["value"]["deterministic"]
    assert settings["value"]["top_k"] is None and settings["value"]["cdf"] is None
    everywhere = PlannerConfig(deterministic=True, value_token="sample").token_sampling()
    assert all(kind["deterministic"] for kind in everywhere.values())
