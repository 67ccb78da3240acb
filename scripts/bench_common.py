"""What the benchmarks share: the paper's HalfCheetah model and search as command-line flags,
and the process's peak memory.

`bench_planner.py` and `bench_rollout.py` time the same model shape and the same beam search;
their flags, defaults and the objects built from them are defined here once.
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import sys

import torch

from trajectory_transformer.model import GPTConfig
from trajectory_transformer.planning import PlannerConfig


def add_model_flags(parser: argparse.ArgumentParser) -> None:
    """Model shape: 4 layers x 128, 4 heads, a window of 10 transitions, 100 bins."""
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--embd", type=int, default=128, help="embedding width")
    parser.add_argument("--seq-transitions", type=int, default=10, help="model window")
    parser.add_argument("--bins", type=int, default=100, help="bins per dimension")


def add_search_flags(parser: argparse.ArgumentParser) -> None:
    """Beam search: beam 32, expand 2, horizon 5, context 5; how it decodes."""
    parser.add_argument("--beam", type=int, default=32)
    parser.add_argument("--expand", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=5)
    parser.add_argument("--context", type=int, default=5, help="context transitions")
    parser.add_argument(
        "--decode",
        default="eager",
        choices=PlannerConfig.DECODES,
        help="planner.decode: eager, or compile (torch.compile of the decode step)",
    )
    parser.add_argument(
        "--cuda-graph",
        default="step",
        choices=PlannerConfig.CUDA_GRAPHS,
        help="planner.cuda_graph: what CUDA captures, none, the decode step or the whole search",
    )
    parser.add_argument("--greedy", action="store_true", help="plan deterministically")


def add_precision_flags(parser: argparse.ArgumentParser) -> None:
    """The precision of the planning: float32 unless one of these is given."""
    parser.add_argument("--bf16", action="store_true", help="plan under bfloat16 autocast (CUDA)")
    parser.add_argument(
        "--tf32", action="store_true", help="plan with float32 matrix products in TF32 (CUDA)"
    )


def precision_flag(args: argparse.Namespace) -> str:
    """`bf16`, `tf32` or `fp32`, from `--bf16` and `--tf32` (which exclude each other)."""
    if args.bf16 and args.tf32:
        raise SystemExit("--bf16 and --tf32 exclude each other: give one of them")
    return "bf16" if args.bf16 else "tf32" if args.tf32 else "fp32"


def planning_precision(precision: str, device: torch.device):
    """The context to plan in: `bf16`, bfloat16 autocast (`--bf16`; it keeps no cache of cast
    weights, which a CUDA graph capture would not allow); `tf32`, float32 matrix products on
    the tensor cores (TF32 inputs, on CUDA); anything else, float32 as it is."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    if precision == "tf32":
        return TF32Matmuls()
    return contextlib.nullcontext()


class TF32Matmuls:
    """CUDA float32 matrix products in TF32 inside the block (compiled graphs and captures
    made inside it keep it), restored after; reusable, as a timing loop enters it each call."""

    def __enter__(self) -> None:
        self.previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True

    def __exit__(self, *exc_info) -> None:
        torch.backends.cuda.matmul.allow_tf32 = self.previous


def model_config(args: argparse.Namespace, observation_dim: int, action_dim: int) -> GPTConfig:
    """The model of `add_model_flags` for these dimensions, without dropout (inference)."""
    return GPTConfig(
        observation_dim=observation_dim,
        action_dim=action_dim,
        n_bins=args.bins,
        sequence_transitions=args.seq_transitions,
        n_layer=args.layers,
        n_head=args.heads,
        embedding_dim=args.embd,
        dropout=0.0,
    )


def search_settings(args: argparse.Namespace) -> dict:
    """`BeamPlanner` keyword arguments of `add_search_flags` (and `--seed`)."""
    return dict(
        horizon=args.horizon,
        beam_width=args.beam,
        n_expand=args.expand,
        context_transitions=args.context,
        seed=args.seed,
        decode=args.decode,
        cuda_graph=args.cuda_graph,
        deterministic=args.greedy,
    )


def peak_rss_mib() -> float:
    """The process's RSS high-water mark in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (2**20 if sys.platform == "darwin" else 2**10)
