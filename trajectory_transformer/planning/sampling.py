"""Token sampling for the planner: pure functions on device, no host synchronisation.

The order follows the original Trajectory Transformer: divide by the temperature, then keep
the smallest set of tokens whose cumulative probability reaches `cdf`, then the `top_k` most
likely, then draw. Draws use the exponential race (argmax of p / Exp(1)), which samples from p
exactly and, unlike `torch.multinomial`, never checks the distribution on the host. The Exp(1)
noise is drawn ahead, a whole search's worth at a time (`SearchNoise`), so sampling is an
argmax over given tensors: no generator inside the search, which a captured or compiled search
could not call.
"""

from __future__ import annotations

import math

import torch

MIN_TEMPERATURE = 1e-6
"""The coldest search. Float32 logits divided by a temperature that rounds to zero (below about
1e-45), or so small that the quotient overflows, become infinities, and their softmax NaN; at
1e-6 any logit below 1e32 stays finite."""


def filter_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Logits (..., N) with all but the `k` largest per row set to -inf (exactly k kept)."""
    if k >= logits.shape[-1]:
        return logits
    if k < 1:
        raise ValueError(f"top-k needs k >= 1, got {k}")
    values, index = logits.topk(k, dim=-1)  # (..., k)
    return torch.full_like(logits, float("-inf")).scatter_(-1, index, values)


def filter_cdf(logits: torch.Tensor, cdf: float) -> torch.Tensor:
    """Logits (..., N) keeping the smallest set of most likely tokens whose mass reaches `cdf`.

    The most likely token is always kept; the others are set to -inf.
    """
    if not 0.0 < cdf <= 1.0:
        raise ValueError(f"cdf must be in (0, 1], got {cdf}")
    probs = logits.softmax(dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (..., N)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of more likely tokens
    drop_sorted = mass_before >= cdf  # (..., N), in sorted order
    drop = torch.empty_like(drop_sorted).scatter_(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def filter_logits(
    logits: torch.Tensor,
    temperature: float = 1.0,
    top_k: int | None = None,
    cdf: float | None = None,
) -> torch.Tensor:
    """Temperature, then cumulative-probability, then top-k filtering of logits (..., N)."""
    if not (math.isfinite(temperature) and temperature >= MIN_TEMPERATURE):
        raise ValueError(
            f"temperature must be a finite number of at least {MIN_TEMPERATURE:g}, got "
            f"{temperature}; for the most likely token use greedy sampling instead"
        )
    if temperature != 1.0:
        logits = logits / temperature
    if cdf is not None:
        logits = filter_cdf(logits, cdf)
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    return logits


def exponential_noise_(out: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Fill `out` with Exp(1) draws from `generator`, in place; returns it.

    Drawn as -log(U), cheaper than `exponential_` on the CPU. U < 1 keeps every draw above 0
    (a zero draw would turn a zero-probability token into 0/0 = NaN, which argmax picks); the
    clamp keeps it finite, so a possible token always beats impossible ones.
    """
    torch.rand(out.shape, generator=generator, dtype=out.dtype, device=out.device, out=out)
    return out.clamp_min_(1e-30).log_().neg_()


def sample_categorical(logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """One token index (...,) int64 per row of logits (..., N): the exponential race over
    Exp(1) `noise` (..., N), argmax of p / noise."""
    return (logits.softmax(dim=-1) / noise).argmax(dim=-1)


def draws_noise(top_k: int | None = None, deterministic: bool = False, **_: object) -> bool:
    """Whether `sample_tokens` with these settings reads noise: not when greedy."""
    return not (deterministic or top_k == 1)


def sample_tokens(
    logits: torch.Tensor,
    noise: torch.Tensor | None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    cdf: float | None = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """Tokens (...,) from logits (..., N): greedy when `deterministic`, else filtered draws
    with Exp(1) `noise` (..., N).

    Greedy ignores the filters and the temperature: none of them moves the argmax. Top-1 (the
    planner's default for observations) keeps only the argmax, so it is greedy too and reads
    no noise (`draws_noise`).
    """
    if not draws_noise(top_k, deterministic):
        return logits.argmax(dim=-1)
    return sample_categorical(filter_logits(logits, temperature, top_k, cdf), noise)


class SearchNoise:
    """The Exp(1) noise of every draw of one search (`transitions` planned transitions), for G
    environments.

    Per env and transition, in this order: the A action tokens of its X * B candidates, their
    reward and value tokens, then the O observation tokens of its B beams (each kind only
    where it is sampled); the transitions one after the other, the last without observation
    draws, since no transition follows it. `draw` fills each env's share from that env's own
    generator in one call, before the search, so an env's plans depend on its stream alone,
    not on which other envs are planned beside it, and the search itself calls no generator
    (it can be captured as one CUDA graph). `rows` hands a draw out in the rows' `RowLayout`
    order (copy, env, beam).
    """

    def __init__(
        self,
        sampling: dict[str, dict],
        action_dim: int,
        observation_dim: int,
        n_bins: int,
        groups: int,
        beams: int,
        copies: int,
        transitions: int,
        device: torch.device | str | None = None,
    ) -> None:
        self.groups, self.beams, self.copies = groups, beams, copies
        candidates = copies * beams
        counts = {"act": action_dim, "reward": 1, "value": 1, "obs": observation_dim}
        self._segments: dict[str, tuple[int, int, int]] = {}  # kind: (start, draws, rows)
        start = 0
        for kind, count in counts.items():
            if draws_noise(**sampling[kind]):
                rows = beams if kind == "obs" else candidates
                self._segments[kind] = (start, count, rows)
                start += count * rows
        self._per_transition = start
        obs_draws = counts["obs"] * beams if "obs" in self._segments else 0
        draws = transitions * start - obs_draws
        self.buffer = torch.empty(groups, max(draws, 0), n_bins, device=device)  # (G, draws, N)

    def draw(self, generators: list[torch.Generator]) -> None:
        """New noise for a whole search, env g's from `generators[g]`."""
        for env, generator in enumerate(generators):
            exponential_noise_(self.buffer[env], generator)

    def rows(self, kind: str, index: int = 0, transition: int = 0) -> torch.Tensor | None:
        """Noise (rows, N) for draw `index` of `kind` (obs, act, reward, value) in planned
        `transition`, rows in (copy, env, beam) order (observations: the beams only); None if
        not sampled."""
        if kind not in self._segments:
            return None
        start, _, rows = self._segments[kind]
        start += transition * self._per_transition + index * rows
        block = self.buffer[:, start : start + rows]  # (G, rows, N)
        copies = rows // self.beams
        block = block.view(self.groups, copies, self.beams, -1)  # (G, X, B, N)
        return block.transpose(0, 1).reshape(copies * self.groups * self.beams, -1)
