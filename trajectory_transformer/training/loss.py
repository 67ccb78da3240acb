"""The training loss: cross-entropy per target token, weighted by the kind of token it is
(observation, action, reward, value) and averaged over the unpadded tokens. The target is the
token itself, or with `GaussianTargets` a Gaussian over the bins around its real value."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from trajectory_transformer.model import TrajectoryGPT

if TYPE_CHECKING:
    from trajectory_transformer.data.discretizer import Discretizer
    from trajectory_transformer.training.trainer import TrainerConfig

TOKEN_KINDS = ("observation", "action", "reward", "value")


def target_dims(model: TrajectoryGPT) -> torch.Tensor:
    """Transition dimension of each target position of a block (block_size - 1,)."""
    return torch.arange(1, model.config.block_size) % model.config.transition_dim


def loss_weights(model: TrajectoryGPT, cfg: TrainerConfig) -> torch.Tensor:
    """Weight of each target position of a block (block_size - 1,), by the target's dimension."""
    mc = model.config
    per_dim = torch.tensor(
        [cfg.observation_weight] * mc.observation_dim
        + [cfg.action_weight] * mc.action_dim
        + [cfg.reward_weight, cfg.value_weight]
    )
    return per_dim[target_dims(model)]


def token_kinds(model: TrajectoryGPT) -> torch.Tensor:
    """Kind of each target position of a block (block_size - 1,): an index into TOKEN_KINDS."""
    mc = model.config
    per_dim = torch.tensor([0] * mc.observation_dim + [1] * mc.action_dim + [2, 3])
    return per_dim[target_dims(model)]


class GaussianTargets:
    """Each target token as a Gaussian over the bins of its dimension (HL-Gauss: Imani and
    White 2018; Farebrother et al. 2024), in place of the token alone.

    The Gaussian is centred at the real value's position among the bins, its token's index
    plus how far into the bin the value lies (the middle of a bin of zero width), with a
    standard deviation of `sigma` bins, on the bin-index axis: the same spread in tokens
    whatever the bins' widths. Its mass over the dimension's bins in use is renormalised to
    1. The outputs stay categorical, but the loss knows the bins' order: a near miss costs
    less than a far one, and the sub-bin position of the value reaches the model, so rarely
    visited bins learn from their neighbours (measured in docs/results/training-budgets.md).
    """

    def __init__(self, discretizer: Discretizer, sigma: float, device: torch.device) -> None:
        if not sigma > 0:
            raise ValueError(f"sigma must be > 0 bins, got {sigma}")
        self.sigma = float(sigma)
        self.edges = discretizer.edges.to(device)  # (T, N + 1)
        N = discretizer.n_bins
        in_use = torch.arange(N)[None, :] < discretizer.effective_bins.cpu()[:, None]
        self.in_use = in_use.to(device=device, dtype=torch.float32)  # (T, N)
        self.boundaries = torch.arange(N + 1, dtype=torch.float32, device=device)

    def __call__(
        self, tokens: torch.Tensor, values: torch.Tensor, dims: torch.Tensor
    ) -> torch.Tensor:
        """Target probabilities (B, S, N) of tokens (B, S) of dimensions `dims` (S,), whose
        real values are `values` (B, S)."""
        tokens = tokens.long()
        low = self.edges[dims[None, :], tokens]
        width = self.edges[dims[None, :], tokens + 1] - low
        inside = torch.where(
            width > 0, ((values - low) / width.clamp_min(1e-30)).clamp(0.0, 1.0), 0.5
        )
        centre = tokens + inside  # (B, S) on the bin-index axis
        cdf = torch.special.ndtr((self.boundaries - centre[..., None]) / self.sigma)
        mass = (cdf[..., 1:] - cdf[..., :-1]) * self.in_use[dims]  # (B, S, N)
        return mass / mass.sum(-1, keepdim=True)


def token_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, probabilities: torch.Tensor | None = None
) -> torch.Tensor:
    """Cross-entropy of every target token (B, S), in float32 whatever the logits' dtype:
    against the tokens themselves, or against target `probabilities` (B, S, N)."""
    target = targets.flatten() if probabilities is None else probabilities.flatten(0, 1)
    ce = F.cross_entropy(logits.float().flatten(0, 1), target, reduction="none")
    return ce.view_as(targets)


def weighted_loss(
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor,
    token_count: torch.Tensor | None = None,
    probabilities: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cross-entropy per token (against `probabilities` where given), times its dimension's
    weight, averaged over unpadded tokens: this batch's, or `token_count` of them (the global
    batch's, when ranks share one)."""
    ce = token_cross_entropy(logits, targets, probabilities)  # (B, S)
    mask = mask.to(ce.dtype)
    count = mask.sum() if token_count is None else token_count
    return (ce * weights[: ce.shape[1]] * mask).sum() / count.clamp_min(1.0)


def input_values(values: torch.Tensor | None) -> torch.Tensor | None:
    """A batch's real values (B, S) as the inputs of positions [0, S - 1)."""
    return None if values is None else values[:, :-1]
