"""Per-dimension discretisation of continuous transitions into tokens, in torch.

Each dimension j has `n_bins` bins given by `n_bins + 1` sorted edges. `uniform` spaces the
edges evenly between the data's min and max; `quantile` puts an equal share of the data in
each bin. A value maps to the bin that contains it (values outside the fitted range clip to
the edge bins) and a token decodes to its bin centre.
"""

from __future__ import annotations

import numpy as np
import torch

STRATEGIES = ("uniform", "quantile")


class Discretizer:
    def __init__(self, edges: torch.Tensor, strategy: str = "quantile") -> None:
        if edges.ndim != 2 or edges.shape[1] < 2:
            raise ValueError(f"edges must be (dims, n_bins + 1), got {tuple(edges.shape)}")
        self.strategy = strategy
        self.edges = edges.to(torch.float32)  # (D, N + 1)
        self.centres = 0.5 * (self.edges[:, 1:] + self.edges[:, :-1])  # (D, N)
        # Inner edges decide the bin; searchsorted over them gives 0..N-1 with clipping for free.
        self._inner = self.edges[:, 1:-1].contiguous()  # (D, N - 1)

    @classmethod
    def fit(cls, data: np.ndarray, n_bins: int = 100, strategy: str = "quantile") -> Discretizer:
        """Fit edges to `data` of shape (rows, dims), each dimension on its own."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown discretizer {strategy!r}; choose one of {STRATEGIES}")
        if n_bins < 2:
            raise ValueError(f"n_bins must be at least 2, got {n_bins}")
        data = np.asarray(data, dtype=np.float64)
        if strategy == "uniform":
            low, high = data.min(axis=0), data.max(axis=0)
            edges = np.linspace(low, high, n_bins + 1, axis=1)  # (D, N + 1)
        else:
            edges = np.quantile(data, np.linspace(0.0, 1.0, n_bins + 1), axis=0).T
        return cls(torch.from_numpy(edges).float(), strategy)

    @property
    def n_bins(self) -> int:
        return self.centres.shape[1]

    @property
    def dims(self) -> int:
        return self.centres.shape[0]

    @property
    def device(self) -> torch.device:
        return self.edges.device

    def to(self, device: torch.device | str) -> Discretizer:
        return Discretizer(self.edges.to(device), self.strategy)

    def _dims(self, dims: slice | torch.Tensor | None) -> slice | torch.Tensor:
        return slice(None) if dims is None else dims

    def encode(self, x: torch.Tensor, dims: slice | torch.Tensor | None = None) -> torch.Tensor:
        """Values (..., D') -> tokens (..., D') int64, for dimensions `dims` (default all)."""
        inner = self._inner[self._dims(dims)]  # (D', N - 1)
        flat = x.to(inner).reshape(-1, inner.shape[0]).T.contiguous()  # (D', M)
        tokens = torch.searchsorted(inner, flat, right=True)  # (D', M)
        return tokens.T.reshape(x.shape)

    def decode(
        self, tokens: torch.Tensor, dims: slice | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens (..., D') -> bin centres (..., D') float32."""
        centres = self.centres[self._dims(dims)]  # (D', N)
        flat = tokens.reshape(-1, centres.shape[0]).T  # (D', M)
        return torch.gather(centres, 1, flat).T.reshape(tokens.shape)

    def expectation(
        self, probs: torch.Tensor, dim: int, percentile: float | None = None
    ) -> torch.Tensor:
        """Mean (or a percentile) of dimension `dim` under token probabilities (..., N)."""
        centres = self.centres[dim]  # (N,)
        if percentile is None:
            return probs @ centres
        # The smallest bin whose cumulative probability reaches the percentile.
        cdf = probs.cumsum(dim=-1)
        index = torch.searchsorted(cdf, torch.full_like(cdf[..., :1], percentile)).clamp_(
            max=self.n_bins - 1
        )
        return centres[index.squeeze(-1)]

    def reconstruction_error(self, data: np.ndarray) -> np.ndarray:
        """Mean absolute round-trip error per dimension, relative to each dimension's range."""
        x = torch.as_tensor(np.asarray(data, dtype=np.float32), device=self.device)
        error = (self.decode(self.encode(x)) - x).abs().mean(dim=0)
        span = (self.edges[:, -1] - self.edges[:, 0]).clamp_min(1e-12)
        return (error / span).cpu().numpy()

    def state_dict(self) -> dict:
        return {"edges": self.edges.cpu(), "strategy": self.strategy}

    @classmethod
    def from_state_dict(cls, state: dict) -> Discretizer:
        return cls(state["edges"], state["strategy"])
