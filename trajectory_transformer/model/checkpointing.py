"""Activation checkpointing of the transformer blocks: training memory for time.

`full` keeps only each checkpointed block's input and reruns its forward during backward;
`selective` also keeps the outputs of the matrix products and attention kernels, and reruns
only the cheap pointwise ops. Same loss and gradients in every mode (`GPTConfig`).
"""

from __future__ import annotations

import functools

import torch
import torch.nn as nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)


def _attention_ops() -> frozenset:
    """The ops whose outputs `selective` checkpointing keeps: matrix products and fused
    attention kernels (those this build has), the ops that cost time to rerun.

    Not `baddbmm`: in the CPU dropout attention it makes the (B * nh, S, S) scores, the largest
    tensor of a block (over 40% of what `selective` would keep per block at the paper's
    shape), and redoing it is an eighth of the block's forward FLOPs.
    """
    aten = torch.ops.aten
    names = (
        "mm",
        "addmm",
        "bmm",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
    )
    return frozenset(getattr(aten, name) for name in names if hasattr(aten, name))


_KEPT_BY_SELECTIVE = _attention_ops()


def _selective_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    # Pointwise ops, norms, GELU and dropout are memory-bound and cheap to redo; the products
    # are what a recompute would pay for.
    if op.overloadpacket in _KEPT_BY_SELECTIVE:
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def checkpointed_blocks(
    blocks: nn.ModuleList, x: torch.Tensor, mask: torch.Tensor, mode: str, every: int
) -> torch.Tensor:
    """x (B, S, C) through `blocks` under `mask` (S, S), checkpointing (`mode` `full` or
    `selective`) the blocks whose index is a multiple of `every`."""
    options = {}
    if mode == "selective":
        options["context_fn"] = functools.partial(
            create_selective_checkpoint_contexts, _selective_policy
        )
    for layer, block in enumerate(blocks):
        if layer % every == 0:
            # Non-reentrant, and the RNG state is restored for the rerun, so the recomputed
            # dropout masks are the ones the forward drew.
            x = checkpoint(block, x, mask, use_reentrant=False, **options)  # (B, S, C)
        else:
            x = block(x, mask)  # (B, S, C)
    return x
