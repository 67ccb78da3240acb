"""Token sampling for the planner: pure functions on device, no host synchronisation.

The order follows the original Trajectory Transformer: divide by the temperature, then keep
the smallest set of tokens whose cumulative probability reaches `cdf`, then the `top_k` most
likely, then draw. Draws use the exponential race (argmax of p / Exp(1)), which samples from p
exactly with one `torch.Generator` and, unlike `torch.multinomial`, never checks the
distribution on the host.
"""

from __future__ import annotations

import torch


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
    if temperature <= 0.0:
        raise ValueError(f"temperature must be positive, got {temperature}; use greedy instead")
    if temperature != 1.0:
        logits = logits / temperature
    if cdf is not None:
        logits = filter_cdf(logits, cdf)
    if top_k is not None:
        logits = filter_top_k(logits, top_k)
    return logits


def sample_categorical(logits: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token index (...,) int64 per row of logits (..., N), drawn with `generator`."""
    probs = logits.softmax(dim=-1)
    # Exp(1) draws as -log(U), cheaper than `exponential_` on the CPU. U < 1 keeps
    # every draw above 0 (a zero draw would turn a zero-probability token into 0/0 = NaN, which
    # argmax picks); the clamp keeps it finite, so a possible token always beats impossible ones.
    uniform = torch.rand(probs.shape, generator=generator, dtype=probs.dtype, device=probs.device)
    race = uniform.clamp_min_(1e-30).log_().neg_()  # (..., N)
    return (probs / race).argmax(dim=-1)


def sample_tokens(
    logits: torch.Tensor,
    generator: torch.Generator | None,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    cdf: float | None = None,
    deterministic: bool = False,
) -> torch.Tensor:
    """Tokens (...,) from logits (..., N): greedy when `deterministic`, else filtered draws.

    Greedy ignores the filters and the temperature: none of them moves the argmax. Top-1 (the
    planner's default for observations) keeps only the argmax, so it is greedy too and draws
    nothing.
    """
    if deterministic or top_k == 1:
        return logits.argmax(dim=-1)
    return sample_categorical(filter_logits(logits, temperature, top_k, cdf), generator)
