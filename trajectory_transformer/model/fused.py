"""The decode step on CUDA as one Triton kernel per transformer block.

A planner's decode step runs one new token per row through the model. Through PyTorch, even
compiled by inductor and replayed as a CUDA graph, that is about a hundred kernels per step,
each a few microseconds of latency over a few dozen kilobytes of work: the step is bound by
how many kernels it launches, not by arithmetic or bytes (BENCHMARKS.md, "On the GPU").

Here each block is one kernel over a tile of `ROWS` rows: the embedding (first block), layer
norm, the query, key and value of every head, the write of this token's key and value into
the rows' own cache positions, the attention over the group's shared prefix and the row's own
earlier positions (an online softmax over tiles of keys, reading only the positions written
so far), the output projection, the MLP with its exact GELU, and (last block) the final norm
and the dimension's head. The position and the prefix's end are read on the device, so the
step has the same launches at every position, needs no host sync, and can be captured as a
CUDA graph. Matrix products use full float32 (`input_precision="ieee"`), so the logits agree
with the PyTorch step up to float rounding.

The mask is the training mask with `value_sees_itself` (the one the native CPU decoder also
implements): a token sees every earlier position except value tokens, and itself.

`TRITON_INTERPRET=1` in the environment runs the same kernels on the CPU through Triton's
interpreter (slowly): that is how the tests check them on machines without a GPU.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from trajectory_transformer.model.kv_cache import SharedPrefixKVCache
from trajectory_transformer.model.native import prepared_weights

if TYPE_CHECKING:
    from trajectory_transformer.model.gpt import TrajectoryGPT

ROWS = 16
"""Rows per program: the smallest tile that Triton's matrix product takes."""
KEYS = 16
"""Cached positions per tile of the attention's online softmax."""
HIDDEN = 32
"""MLP columns per tile: the hidden layer is never held whole."""


def interpreted() -> bool:
    """Whether Triton runs its kernels on the CPU, through its interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def unavailable_reason(model: TrajectoryGPT) -> str | None:
    """Why the fused step cannot decode `model`, or None if it can."""
    p = model.head_weight
    if model.training:
        return "it decodes for inference, without dropout; call model.eval() first"
    if p.dtype != torch.float32:
        return f"it computes in float32, and the model is {p.dtype}"
    if not model.config.value_sees_itself:
        return "it implements the mask where a value token sees itself (model.value_sees_itself)"
    if p.device.type != "cuda" and not interpreted():
        return (
            f"it runs on CUDA (the model is on {p.device.type}); TRITON_INTERPRET=1 runs it "
            "on the CPU through Triton's interpreter, slowly"
        )
    if importlib.util.find_spec("triton") is None:
        return "Triton is not installed (PyTorch's CUDA builds for Linux bring it)"
    return None


def _kernel() -> Callable:
    """The block kernel. Triton decides when the kernels are defined whether they run on the
    GPU or through the interpreter: `TRITON_INTERPRET` as it is at the first import."""
    from trajectory_transformer.model import fused_kernels

    return fused_kernels.block_kernel


def _padded(n: int) -> int:
    """The power of two at or above n, and at least 16 (Triton's smallest matrix tile)."""
    return max(16, 1 << (n - 1).bit_length())


def decoder(
    model: TrajectoryGPT, cache: SharedPrefixKVCache
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`model`'s decode step over `cache` as one kernel per block:
    `step(tokens (R,), position (1,) on the device) -> logits (R, N)`, for any whole copies of
    the cache's rows at a position after its prefix (not checked: that would sync). Raises
    where it cannot run (`unavailable_reason`)."""
    reason = unavailable_reason(model)
    if not isinstance(cache, SharedPrefixKVCache):
        reason = "it decodes over a SharedPrefixKVCache (a planner's cache) only"
    if reason is not None:
        raise ValueError(f"planner.decode=fused cannot run here: {reason}")
    kernel = _kernel()
    config = model.config
    weights = prepared_weights(model)
    C, NH, N, T = config.embedding_dim, config.n_head, config.n_bins, config.transition_dim
    HS, HID = C // NH, 4 * C
    layers = [
        (parameters, cache.native_layer(layer), weights.eps[2 * layer : 2 * layer + 2])
        for layer, parameters in enumerate(weights.layers)
    ]
    sizes = dict(
        NH=NH,
        HS=HS,
        CP=_padded(C),
        HSP=_padded(HS),
        NP=_padded(N),
        HIDP=-(-HID // HIDDEN) * HIDDEN,
        BR=ROWS,
        KB=KEYS,
        HB=HIDDEN,
    )
    # Many warps per program on a GPU: the attention's tiles are (rows, keys, head width).
    launch = {} if interpreted() else {"num_warps": 8}
    prefix_capacity, own_capacity = cache.prefix.max_len, cache.own.max_len

    def step(tokens: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
        tokens = tokens.contiguous()  # the kernel reads row r's token at offset r
        rows = tokens.shape[0]
        layout = cache.layout
        layout.copies(rows)  # raises unless whole copies: shapes only, no sync
        x = torch.empty(rows, C, device=tokens.device)
        logits = torch.empty(rows, N, device=tokens.device)
        grid = (-(-rows // ROWS),)
        last = len(layers) - 1
        for layer, (parameters, (pk, pv, ok, ov), (eps1, eps2)) in enumerate(layers):
            kernel[grid](
                x,
                tokens,
                position,
                cache.prefix_end,
                weights.tok_emb,
                weights.pos_emb,
                *parameters,
                pk,
                pv,
                ok,
                ov,
                weights.ln_f_weight,
                weights.ln_f_bias,
                weights.head_weight,
                weights.head_bias,
                logits,
                rows,
                layout.members,
                layout.groups,
                prefix_capacity,
                own_capacity,
                T,
                N,
                C,
                HID,
                eps1,
                eps2,
                weights.ln_f_eps,
                HS**-0.5,
                FIRST=layer == 0,
                LAST=layer == last,
                **sizes,
                **launch,
            )
        return logits

    return step
