"""Whether settings fit the machine, checked before the work: a model, a batch or a search far
too large for its memory is refused in one line with the estimate, instead of an allocation
error, a process killed by the kernel, or an hour spent building modules.

The estimates are coarse on purpose (within a factor of about two): they refuse only what
cannot run, never a setting that is merely large.
"""

from __future__ import annotations

import os

import torch

from trajectory_transformer.model.gpt import GPTConfig
from trajectory_transformer.planning.config import PlannerConfig

FLOAT_BYTES = 4


def parameter_count(config: GPTConfig) -> int:
    """TrajectoryGPT's parameters: token and position embeddings, per block two norms, the
    attention's input and output projections and the 4x MLP, the final norm and one head per
    transition dimension (pinned to the model by a test)."""
    T, N, d, L = config.transition_dim, config.n_bins, config.embedding_dim, config.n_layer
    block = 2 * 2 * d + (3 * d * d + 3 * d) + (d * d + d) + (4 * d * d + 4 * d) + (4 * d * d + d)
    return T * N * d + config.block_size * d + L * block + 2 * d + T * d * N + T * N


def training_bytes(config: GPTConfig, batch_size: int) -> int:
    """A training step's memory: weights, gradients and two optimiser moments, and the
    activations kept for the backward pass (per layer and token about 20 widths and the
    attention weights of every head), and the logits."""
    tokens = batch_size * config.block_size
    per_token = config.n_layer * (20 * config.embedding_dim + 3 * config.n_head * config.block_size)
    activations = tokens * (per_token + 3 * config.n_bins)
    return FLOAT_BYTES * (4 * parameter_count(config) + activations)


def planning_bytes(config: GPTConfig, planner: PlannerConfig, envs: int) -> int:
    """A search's memory: the cached keys and values of every row's planned positions, a few
    logits-sized buffers per row, and the noise of the whole search, drawn before it (at most
    one logits-sized draw per planned token and row), besides the weights."""
    rows = envs * planner.beam_width * planner.n_expand
    planned = planner.horizon * config.transition_dim
    cache = 2 * config.n_layer * planned * config.embedding_dim
    noise = planned * config.n_bins
    return FLOAT_BYTES * (parameter_count(config) + rows * (cache + 4 * config.n_bins + noise))


def memory_of(device: torch.device) -> int:
    """The memory a process can hope for on `device`: the GPU's, or the machine's RAM."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # a platform without sysconf: no check
        return 2**63


def gigabytes(count: int) -> str:
    return f"{count / 2**30:,.1f} GB"


def check_fits(needed: int, device: torch.device, what: str, advice: str) -> None:
    """Raise a ValueError naming `what`, the estimate and the memory, unless it fits."""
    available = memory_of(device)
    if needed > available:
        raise ValueError(
            f"{what} needs about {gigabytes(needed)} of memory, more than the "
            f"{gigabytes(available)} of {device.type}; {advice}"
        )


def check_training_fits(config: GPTConfig, batch_size: int, device: torch.device) -> None:
    check_fits(
        training_bytes(config, batch_size),
        device,
        f"training a model of {parameter_count(config):,} parameters on batches of {batch_size}",
        "lower model.n_layer, model.embedding_dim, model.sequence_transitions, dataset.n_bins "
        "or trainer.batch_size",
    )


def check_planning_fits(
    config: GPTConfig, planner: PlannerConfig, envs: int, device: torch.device
) -> None:
    check_fits(
        planning_bytes(config, planner, envs),
        device,
        f"planning for {envs} envs with {planner.beam_width} beams x {planner.n_expand} "
        f"expansions over {planner.horizon} transitions",
        "lower planner.beam_width, planner.n_expand, planner.horizon or eval.num_envs",
    )
