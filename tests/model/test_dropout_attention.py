"""The CPU training attention (`dropout_attention`) is F.scaled_dot_product_attention with the
same dropout draws: same outputs and gradients under one seed, in less memory."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from trajectory_transformer.model import GPTConfig, TrajectoryGPT, gpt, trajectory_attention_mask
from trajectory_transformer.model.gpt import dropout_attention


def inputs(B: int, nh: int, S: int, hs: int, dtype=torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, nh, S, hs, generator=g, dtype=dtype) for _ in range(4)]


def run(attention, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Output, q/k/v gradients and the next draw of the global generator, from seed 7."""
    q, k, v = (t.clone().requires_grad_() for t in tensors[:3])
    torch.manual_seed(7)
    y = attention(q, k, v)
    y.backward(tensors[3])
    return [y.detach(), q.grad, k.grad, v.grad, torch.rand(4)]


@pytest.mark.parametrize("p", [0.1, 0.5])
@pytest.mark.parametrize(("B", "nh", "S", "hs", "T"), [(3, 2, 47, 8, 5), (2, 4, 64, 16, 25)])
def test_matches_sdpa_with_the_same_dropout(p, B, nh, S, hs, T) -> None:
    mask = trajectory_attention_mask(S, T)
    tensors = inputs(B, nh, S, hs)
    expected = run(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p),
        tensors,
    )
    got = run(lambda q, k, v: dropout_attention(q, k, v, mask, p), tensors)
    for name, a, b in zip(["output", "dq", "dk", "dv", "rng after"], got, expected, strict=True):
        # SDPA scales q and k before the product, this scales the scores: float32 rounding.
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_gradients_are_exact_in_float64() -> None:
    mask = trajectory_attention_mask(20, 5)
    q, k, v, _ = (t.requires_grad_() for t in inputs(2, 2, 20, 4, torch.float64))

    def seeded(q, k, v):
        torch.manual_seed(3)  # the same keep mask at every evaluation
        return dropout_attention(q, k, v, mask, 0.3)

    assert torch.autograd.gradcheck(seeded, (q, k, v))


def test_a_dropout_model_trains_as_with_sdpa(monkeypatch: pytest.MonkeyPatch) -> None:
    config = GPTConfig(3, 2, 11, sequence_transitions=3, n_layer=2, n_head=2, embedding_dim=16)
    tokens = torch.randint(11, (4, config.block_size), generator=torch.Generator().manual_seed(1))

    def loss_and_grads() -> list[torch.Tensor]:
        torch.manual_seed(0)
        model = TrajectoryGPT(config).train()
        model(tokens).logsumexp(-1).mean().backward()
        return [p.grad for p in model.parameters()]

    calls = []
    real = gpt.dropout_attention
    monkeypatch.setattr(gpt, "dropout_attention", lambda *a: calls.append(1) or real(*a))
    ours = loss_and_grads()
    assert len(calls) == config.n_layer
    monkeypatch.setattr(
        gpt,
        "dropout_attention",
        lambda q, k, v, mask, p: F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=p
        ),
    )
    for a, b in zip(ours, loss_and_grads(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_runs_under_bf16_autocast() -> None:
    mask = trajectory_attention_mask(30, 5)
    tensors = inputs(2, 2, 30, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(
            lambda q, k, v: dropout_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), mask, 0.2),
            tensors,
        )
    expected = run(
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.2),
        tensors,
    )
    assert got[0].dtype == torch.bfloat16
    for a, b in zip(got[:4], expected[:4], strict=True):
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.05)
