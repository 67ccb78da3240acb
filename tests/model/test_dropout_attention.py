"""The CPU training attention (`dropout_attention`) is F.scaled_dot_product_attention in less
memory: without the native kernels it makes the same dropout draws (same outputs and gradients
under one seed); with them, its keep mask comes from the native kernel, and outputs and
gradients equal a plain composition of torch operators under that mask."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from trajectory_transformer.model import (
    GPTConfig,
    TrajectoryGPT,
    gpt,
    trajectory_attention_mask,
)
from trajectory_transformer.model.decode import native
from trajectory_transformer.model.dropout import Dropout, dropout_attention


@pytest.fixture(autouse=True)
def bernoulli_draws(request):
    """Every test but the native kernel's draws its masks as SDPA does."""
    if "kernels" in request.fixturenames:
        yield
        return
    with native.native_kernels(False):
        yield


@pytest.fixture(scope="module")
def kernels(native_module):
    return native_module


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


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_native_draw_equals_plain_operators_under_its_mask(kernels, p) -> None:
    B, nh, S, hs, T = 3, 2, 47, 8, 5
    mask = trajectory_attention_mask(S, T)
    tensors = inputs(B, nh, S, hs)
    got = run(lambda q, k, v: dropout_attention(q, k, v, mask, p), tensors)

    def reference(q, k, v):
        scores = (q @ k.transpose(-1, -2) / math.sqrt(hs)).masked_fill(~mask, float("-inf"))
        probs = scores.softmax(-1)
        seed = int(torch.empty((), dtype=torch.int64).random_())  # as the model draws it
        _, keep = kernels.dropout(probs.detach().reshape(B * nh, S, S), p, seed, 1.0)
        return torch.where(keep.view(B, nh, S, S), probs, 0.0) @ v / (1 - p)

    expected = run(reference, tensors)
    for name, a, b in zip(["output", "dq", "dk", "dv", "rng after"], got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_the_native_mask_keeps_one_minus_p_whatever_the_threads(kernels) -> None:
    probs = torch.rand(6, 50, 50) + 0.5
    p, n = 0.1, probs.numel()
    dropped, keep = kernels.dropout(probs, p, 12345, 1.0)
    assert keep.dtype == torch.bool and keep.shape == probs.shape
    assert torch.equal(dropped, torch.where(keep, probs, 0.0))
    scaled = kernels.dropout(probs, p, 12345, 1 / (1 - p))[0]
    torch.testing.assert_close(scaled, torch.where(keep, probs / (1 - p), 0.0))
    kept = keep.sum().item()  # binomial(n, 1 - p): 6 standard deviations
    assert abs(kept - n * (1 - p)) < 6 * math.sqrt(n * p * (1 - p))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(kernels.dropout(probs, p, 12345, 1.0)[1], keep)
    finally:
        torch.set_num_threads(threads)
    other = kernels.dropout(probs, p, 12346, 1.0)[1]
    assert not torch.equal(other, keep)
    # No correlation between neighbouring draws (one 64-bit hash gives two 32-bit ones).
    even, odd = keep.flatten()[0::2].float(), keep.flatten()[1::2].float()
    assert abs(torch.corrcoef(torch.stack([even, odd]))[0, 1].item()) < 0.05


def test_the_model_dropout_draws_natively_and_backpropagates_its_mask(kernels) -> None:
    x = torch.randn(8, 30, 16, generator=torch.Generator().manual_seed(0)).requires_grad_()
    dropout = Dropout(0.2).train()
    torch.manual_seed(5)
    y = dropout(x)
    y.backward(torch.ones_like(y))
    keep = y != 0
    assert abs(keep.float().mean().item() - 0.8) < 0.03
    torch.testing.assert_close(y[keep], x[keep] / 0.8)
    torch.testing.assert_close(x.grad, keep.float() / 0.8)
    torch.manual_seed(5)  # the mask comes from torch's generator
    assert torch.equal(dropout(x), y)
    assert dropout.eval()(x) is x


def test_torch_compile_traces_the_dropout_model_in_one_graph(kernels) -> None:
    """Under torch.compile the native draws step aside (a pybind call would break the graph)."""
    config = GPTConfig(3, 2, 11, sequence_transitions=3, n_layer=2, n_head=2, embedding_dim=16)
    model = TrajectoryGPT(config).train()
    tokens = torch.randint(11, (4, config.block_size), generator=torch.Generator().manual_seed(1))
    explanation = torch._dynamo.explain(model)(tokens)
    assert explanation.graph_break_count == 0, explanation.break_reasons
