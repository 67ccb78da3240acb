"""Training dropout on the CPU: the model's `Dropout` and the attention with dropout.

Both draw their keep masks from the native kernel (`decode/native.py`) when training in
float32 on the CPU: one pass that draws and applies a mask, where torch's `bernoulli_` is a
large part of a training step. Elsewhere (CUDA, bf16, torch.compile), or without the
kernels, they draw as torch does.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn

from trajectory_transformer.model.decode import native


def _dropout_seed() -> int:
    """One draw of torch's generator seeds a native dropout mask, so that a seed (`resume=`)
    and checkpointing's recomputation, which restores the generator, draw the same mask."""
    return int(torch.empty((), dtype=torch.int64).random_())


def _native_dropout_applies(x: torch.Tensor) -> bool:
    """Float32 on the CPU, and not under torch.compile, which generates its own dropout."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and not torch.compiler.is_compiling()


class _NativeDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p, kernels):
        scale = 1.0 / (1.0 - p)
        y, keep = kernels.dropout(x.contiguous(), p, _dropout_seed(), scale)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return y

    @staticmethod
    def backward(ctx, dy):
        (keep,) = ctx.saved_tensors
        return torch.where(keep, dy * ctx.scale, 0.0), None, None


class Dropout(nn.Dropout):
    """nn.Dropout whose mask, when training in float32 on the CPU, comes from the native kernel.
    Elsewhere (CUDA, bf16, torch.compile), or without the kernels, it is nn.Dropout."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and 0 < self.p < 1 and _native_dropout_applies(x):
            kernels = native.kernels()
            if kernels is not None:
                return _NativeDropout.apply(x, self.p, kernels)
        return super().forward(x)


class _DropoutAttention(torch.autograd.Function):
    """softmax(q k^T / sqrt(hs) + bias) with dropout, times v: what F.scaled_dot_product_attention
    computes for a mask and dropout on the CPU, in less memory and time.

    With dropout the CPU has no fused kernel; SDPA's math path keeps three (B, nh, S, S)
    float32 tensors per layer for the backward pass (the probabilities, the dropout noise and
    the dropped probabilities). This keeps the probabilities and a one-byte keep mask. The mask
    comes from the native kernel (see `Dropout`); without the kernels, or in another dtype than
    float32, it is drawn as SDPA draws it (one `bernoulli_` over the probabilities' shape), so
    that under one seed both drop the same weights. Every row must keep at least one key.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, p):  # q, k, v (B, nh, S, hs); bias (S, S), 0 or -inf
        B, nh, S, hs = q.shape
        scale = 1.0 / math.sqrt(hs)
        q3, k3, v3 = (t.reshape(B * nh, S, hs) for t in (q, k, v))  # (B*nh, S, hs)
        scores = torch.baddbmm(bias, q3, k3.transpose(1, 2), alpha=scale)  # (B*nh, S, S)
        probs = torch.softmax(scores, dim=-1)  # (B*nh, S, S)
        del scores
        kernels = native.kernels() if _native_dropout_applies(probs) else None
        if kernels is not None:
            dropped, keep = kernels.dropout(probs, p, _dropout_seed(), 1.0)
        else:
            keep = torch.empty_like(probs, dtype=torch.bool).bernoulli_(1.0 - p)
            dropped = torch.where(keep, probs, 0.0)
        # The 1 / (1 - p) rescaling is applied to the small (B*nh, S, hs) side; not in place,
        # as selective checkpointing may hold on to the product.
        y = torch.bmm(dropped, v3) * (1.0 / (1.0 - p))  # (B*nh, S, hs)
        del dropped
        ctx.save_for_backward(q3, k3, v3, probs, keep)
        ctx.p, ctx.scale = p, scale
        return y.view(B, nh, S, hs)

    @staticmethod
    def backward(ctx, dy):  # dy (B, nh, S, hs)
        q3, k3, v3, probs, keep = ctx.saved_tensors
        B, nh, S, hs = dy.shape
        dy3 = dy.reshape(B * nh, S, hs) * (1.0 / (1.0 - ctx.p))  # (B*nh, S, hs)
        # where/masked_fill rather than a product: multiplying by a bool mask converts it to
        # a float copy first.
        dv = torch.bmm(torch.where(keep, probs, 0.0).transpose(1, 2), dy3)  # (B*nh, S, hs)
        dprobs = torch.bmm(dy3, v3.transpose(1, 2)).masked_fill_(~keep, 0.0)  # (B*nh, S, S)
        dscores = torch.ops.aten._softmax_backward_data(dprobs, probs, -1, probs.dtype)
        del dprobs
        dq = torch.bmm(dscores, k3).mul_(ctx.scale)  # (B*nh, S, hs)
        dk = torch.bmm(dscores.transpose(1, 2), q3).mul_(ctx.scale)  # (B*nh, S, hs)
        shape = (B, nh, S, hs)
        return dq.view(shape), dk.view(shape), dv.view(shape), None, None


def dropout_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, p: float
) -> torch.Tensor:
    """`F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p)` for a boolean
    mask (S, S) and 0 < p < 1, keeping less for the backward pass (see _DropoutAttention)."""
    with torch.autocast(q.device.type, enabled=False):  # run in the dtype q already has
        bias = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)  # (S, S)
        bias.masked_fill_(~mask, float("-inf"))
        k, v = k.to(q.dtype), v.to(q.dtype)
        return _DropoutAttention.apply(q, k, v, bias, p)
