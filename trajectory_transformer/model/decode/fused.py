"""The decode step on CUDA as three Triton kernels per transformer block.

A planner's decode step runs one new token per row through the model. Through PyTorch, even
compiled by inductor and replayed as a CUDA graph, that is about a hundred kernels per step,
each a few microseconds of latency over a few dozen kilobytes of work: the step is bound by
how many kernels it launches, not by arithmetic or bytes (docs/results/planning-gpu.md).

Here a block is three kernels of many short programs. The first runs a program per tile of
`ROWS` rows and head: the embedding (first block) or the previous block's output (its MLP's
partial outputs summed in), layer norm, and the head's query, key and value, the key and value
written into the rows' own cache positions. The attention runs a program per row tile, head
and part of the keys (`PARTS`): an online softmax over tiles of keys, reading only the
positions written so far, over the group's shared prefix in one part and over runs of the
row's own earlier positions (and itself) in the others. The third runs a program per row tile
and `MLP_COLUMNS` hidden columns: the parts of each head's softmax joined, the output
projection, layer norm, and its columns of the MLP with their exact GELU. A last kernel
applies the final norm and the dimension's head.
The position and the prefix's end are read on the device, so the step has the same launches
at every position, needs no host sync, and can be captured as a CUDA graph. Matrix products
run on the tensor cores as three TF32 products each (`input_precision="tf32x3"`), which keeps
float32's accuracy (the logits agree with the PyTorch step up to float rounding) and, unlike
Triton's float32 products on the CUDA cores, fits each program's tiles in its registers.

The mask is the training mask with `value_sees_itself` (the one the native CPU decoder also
implements): a token sees every earlier position except value tokens, and itself.

`TRITON_INTERPRET=1` in the environment runs the same kernels on the CPU through Triton's
interpreter (slowly): that is how the tests check them on machines without a GPU.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from trajectory_transformer.model.decode.native import prepared_weights
from trajectory_transformer.model.kv_cache import SharedPrefixKVCache

if TYPE_CHECKING:
    from trajectory_transformer.model.gpt import TrajectoryGPT

ROWS = 16
"""Rows per program: the smallest tile that Triton's matrix product takes."""
KEYS = 16
"""A row's own cached positions per tile of the attention's online softmax."""
PREFIX_KEYS = 32
"""Shared prefix positions per tile, where a row tile continues one prefix (a matrix product)."""
HIDDEN = 32
"""MLP columns per matrix product: the hidden layer is never held whole."""
PARTS = 3
"""Programs per row tile and head in the attention: the shared prefix, and the row's own
positions in two runs; the MLP kernel joins their softmaxes."""
MLP_COLUMNS = 128
"""The MLP's hidden columns per program; the programs' partial outputs are summed after."""
MLP_ROWS = 16
"""Rows per program of the MLP kernel. Each program reads its whole share of the weights
(the projection and 128 hidden columns) once per tile, so larger tiles read them less often."""
MLP_WARPS = 4
"""Warps per program of the MLP kernel (ptxas spills its registers at 32 rows and four warps)."""


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


def _kernels():
    """The kernels' module. Triton decides when the kernels are defined whether they run on
    the GPU or through the interpreter: `TRITON_INTERPRET` as it is at the first import."""
    from trajectory_transformer.model.decode import fused_kernels

    return fused_kernels


def _padded(n: int) -> int:
    """The power of two at or above n, and at least 16 (Triton's smallest matrix tile)."""
    return max(16, 1 << (n - 1).bit_length())


def decoder(model: TrajectoryGPT, cache: SharedPrefixKVCache) -> Callable[..., torch.Tensor]:
    """`model`'s decode step over `cache` as three kernels per block and a last one (the head):
    `step(tokens (R,), position (1,) on the device) -> logits (R, N)`, for any whole copies of
    the cache's rows at a position after its prefix (not checked: that would sync). Raises
    where it cannot run (`unavailable_reason`)."""
    reason = unavailable_reason(model)
    if not isinstance(cache, SharedPrefixKVCache):
        reason = "it decodes over a SharedPrefixKVCache (a planner's cache) only"
    if reason is not None:
        raise ValueError(f"planner.decode=fused cannot run here: {reason}")
    kernels = _kernels()
    config = model.config
    weights = prepared_weights(model)
    C, NH, N, T = config.embedding_dim, config.n_head, config.n_bins, config.transition_dim
    HS, HID = C // NH, 4 * C
    layers = [
        (parameters, cache.native_layer(layer), weights.eps[2 * layer : 2 * layer + 2])
        for layer, parameters in enumerate(weights.layers)
    ]
    splits = -(-HID // MLP_COLUMNS)
    CP, HSP = _padded(C), _padded(HS)
    # Four warps per program: with eight, ptxas (sm_90) spills the attention's registers, and
    # a 25-env plan call on an H100 took 54.0 ms instead of 39.4.
    launch = {} if interpreted() else {"num_warps": 4}
    prefix_capacity, own_capacity = cache.prefix.max_len, cache.own.max_len

    with_observation = config.observation_vector

    def step(
        tokens: torch.Tensor, position: torch.Tensor, observation: torch.Tensor | None = None
    ) -> torch.Tensor:
        if with_observation and observation is None:
            raise ValueError(model.OBSERVATION_VECTOR_NEEDED)
        tokens = tokens.contiguous()  # the kernels read row r's token at offset r
        # The kernel reads the vectors only where the position takes them (it reads the
        # position itself: no sync); without them, `tokens` fills the unused pointer.
        observation = observation.contiguous() if with_observation else tokens
        rows = tokens.shape[0]
        layout = cache.layout
        layout.copies(rows)  # raises unless whole copies: shapes only, no sync
        new = functools.partial(torch.empty, device=tokens.device)
        entering, after_attention = new(rows, C), new(rows, C)
        partial = new(splits, rows, C)
        queries = new(rows, C)
        parts = new(PARTS, rows, C)
        maxima, sums = new(PARTS, rows, NH), new(PARTS, rows, NH)
        logits = new(rows, N)
        tiles, mlp_tiles = -(-rows // ROWS), -(-rows // MLP_ROWS)
        # A tile of rows continues one prefix when the prefix's members fill whole tiles.
        shared = layout.members % ROWS == 0
        previous_out_bias = weights.layers[0][-1]  # unused by the first block
        for layer, (parameters, (pk, pv, ok, ov), (eps1, eps2)) in enumerate(layers):
            ln1_w, ln1_b, w_attn, b_attn, w_proj, b_proj, ln2_w, ln2_b, w_fc, b_fc, w_out, b_out = (
                parameters
            )
            kernels.qkv_kernel[(tiles, NH)](
                entering,
                after_attention,
                partial,
                previous_out_bias,
                tokens,
                position,
                cache.prefix_end,
                weights.tok_emb,
                weights.pos_emb,
                observation,
                config.observation_dim - 1,
                ln1_w,
                ln1_b,
                w_attn,
                b_attn,
                queries,
                ok,
                ov,
                rows,
                own_capacity,
                T,
                N,
                C,
                eps1,
                NH=NH,
                HS=HS,
                CP=CP,
                HSP=HSP,
                BR=ROWS,
                SPLITS=splits,
                FIRST=layer == 0,
                HAS_OBSERVATION=with_observation,
                **launch,
            )
            kernels.attention_kernel[(tiles, NH, PARTS)](
                queries,
                position,
                cache.prefix_end,
                pk,
                pv,
                ok,
                ov,
                parts,
                maxima,
                sums,
                rows,
                layout.members,
                layout.groups,
                prefix_capacity,
                own_capacity,
                T,
                C,
                HS**-0.5,
                NH=NH,
                HS=HS,
                HSP=HSP,
                BR=ROWS,
                KB=KEYS,
                PKB=PREFIX_KEYS,
                PARTS=PARTS,
                SHARED_PREFIX=shared,
                **launch,
            )
            kernels.mlp_kernel[(mlp_tiles, splits)](
                entering,
                after_attention,
                partial,
                parts,
                maxima,
                sums,
                w_proj,
                b_proj,
                ln2_w,
                ln2_b,
                w_fc,
                b_fc,
                w_out,
                rows,
                C,
                HID,
                eps2,
                NH=NH,
                HS=HS,
                CP=CP,
                HSP=HSP,
                BR=MLP_ROWS,
                HB=HIDDEN,
                SPLIT_COLS=MLP_COLUMNS,
                PARTS=PARTS,
                **({} if interpreted() else {"num_warps": MLP_WARPS}),
            )
            previous_out_bias = b_out
        kernels.head_kernel[(tiles, -(-N // HIDDEN))](
            after_attention,
            partial,
            previous_out_bias,
            position,
            weights.ln_f_weight,
            weights.ln_f_bias,
            weights.head_weight,
            weights.head_bias,
            logits,
            rows,
            T,
            N,
            C,
            weights.ln_f_eps,
            CP=CP,
            BR=ROWS,
            HB=HIDDEN,
            SPLITS=splits,
            **launch,
        )
        return logits

    return step
