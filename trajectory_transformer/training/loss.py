"""The training loss: cross-entropy per target token, weighted by the kind of token it is
(observation, action, reward, value) and averaged over the unpadded tokens."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from trajectory_transformer.model import TrajectoryGPT

if TYPE_CHECKING:
    from trajectory_transformer.training.trainer import TrainerConfig

TOKEN_KINDS = ("observation", "action", "reward", "value")


def loss_weights(model: TrajectoryGPT, cfg: TrainerConfig) -> torch.Tensor:
    """Weight of each target position of a block (block_size - 1,), by the target's dimension."""
    mc = model.config
    per_dim = torch.tensor(
        [cfg.observation_weight] * mc.observation_dim
        + [cfg.action_weight] * mc.action_dim
        + [cfg.reward_weight, cfg.value_weight]
    )
    target_dims = torch.arange(1, mc.block_size) % mc.transition_dim
    return per_dim[target_dims]


def token_kinds(model: TrajectoryGPT) -> torch.Tensor:
    """Kind of each target position of a block (block_size - 1,): an index into TOKEN_KINDS."""
    mc = model.config
    per_dim = torch.tensor([0] * mc.observation_dim + [1] * mc.action_dim + [2, 3])
    return per_dim[torch.arange(1, mc.block_size) % mc.transition_dim]


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of every target token (B, S), in float32 whatever the logits' dtype."""
    ce = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    return ce.view_as(targets)


def weighted_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    token_count: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy per token, times its dimension's weight, averaged over unpadded tokens:
    this batch's, or `token_count` of them (the global batch's, when ranks share one)."""
    ce = token_cross_entropy(logits, targets)  # (B, S)
    mask = mask.to(ce.dtype)
    count = mask.sum() if token_count is None else token_count
    return (ce * weights[: ce.shape[1]] * mask).sum() / count.clamp_min(1.0)


def input_values(values: torch.Tensor | None) -> torch.Tensor | None:
    """A batch's real values (B, S) as the inputs of positions [0, S - 1)."""
    return None if values is None else values[:, :-1]
