"""Behaviour policies that generate embedded datasets: small tanh-Gaussian MLP actors.

The Hopper suite (`suites/locomotion.py`) is collected from actors trained once with SAC by
`scripts/train_behaviour_policy.py`. Only the actor is shipped, as a plain state dict with its
shape, loaded with `torch.load(..., weights_only=True)`: running it needs nothing but torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """Torch on one thread while actors play: their batches are tiny, threads only add waiting."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


class GaussianActor(nn.Module):
    """obs -> (mean, log std) of a Gaussian whose sample, squashed by tanh, is the action in
    [-1, 1]^act_dim (the environments here use that box)."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: int = 128) -> None:
        super().__init__()
        self.obs_dim, self.act_dim, self.hidden = obs_dim, act_dim, hidden
        self.trunk = nn.Sequential(
            nn.Linear(obs_dim, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU()
        )
        self.mean = nn.Linear(hidden, act_dim)
        self.log_std = nn.Linear(hidden, act_dim)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.trunk(obs)
        return self.mean(h), self.log_std(h).clamp(LOG_STD_MIN, LOG_STD_MAX)

    @torch.no_grad()
    def act(
        self, obs: np.ndarray, noise_std: float = 0.0, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        """Actions (N, act_dim) for observations (N, obs_dim): the deterministic tanh(mean),
        plus Gaussian noise of `noise_std` clipped to the box, as D4RL's noisy datasets do."""
        mean, _ = self(torch.as_tensor(obs, dtype=torch.float32))
        action = torch.tanh(mean).numpy().astype(np.float64)
        if noise_std > 0:
            if rng is None:
                raise ValueError("noisy actions need a numpy Generator `rng`")
            action = action + rng.normal(0.0, noise_std, size=action.shape)
        return np.clip(action, -1.0, 1.0)

    def save(self, path: str | Path, **metadata: float | int | str) -> None:
        """The actor's weights, its shape and `metadata` (training step, return, ...)."""
        payload = {
            "state_dict": self.state_dict(),
            "shape": {"obs_dim": self.obs_dim, "act_dim": self.act_dim, "hidden": self.hidden},
            "metadata": metadata,
        }
        torch.save(payload, path)

    @classmethod
    def load(cls, path: str | Path) -> GaussianActor:
        payload = torch.load(path, map_location="cpu", weights_only=True)
        actor = cls(**payload["shape"])
        actor.load_state_dict(payload["state_dict"])
        actor.metadata = payload.get("metadata", {})
        return actor.eval()
