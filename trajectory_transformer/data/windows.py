"""Training windows: `L` consecutive transitions of one episode, tokenised once up front.

The whole dataset is tokenised a single time into one array in which every episode is
followed by `L - 1` padding rows, so a window starting at any step of an episode is a plain
slice that never crosses into the next episode. A batch is one gather of those slices.

The tokens are stored in the smallest integer type that holds `n_bins` bins (one byte for up
to 256 bins, 8x less than int64) and live on the training device (`to(device)`), so that a
batch is gathered where it is used; the embedding takes int64 indices, so each batch is
widened on that device after its gather.

With `real_values`, the windows also keep each token's real value (float32), for a model that
takes them as inputs (`model.value_inputs`).
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from trajectory_transformer.data.discretizer import Discretizer


def token_dtype(n_bins: int) -> torch.dtype:
    """The smallest integer type that holds the tokens 0 .. n_bins - 1 and that torch can
    gather from (its uint16 and uint32 support few operators)."""
    if n_bins <= 256:
        return torch.uint8
    if n_bins <= 2**15:
        return torch.int16
    return torch.int32


class TokenWindows:
    """All windows of a dataset; window i starts at transition `starts[i]` of its episode."""

    def __init__(
        self,
        transitions: np.ndarray,
        lengths: np.ndarray,
        discretizer: Discretizer,
        sequence_transitions: int,
        real_values: bool = False,
    ) -> None:
        length = sequence_transitions
        tokens = discretizer.encode(torch.as_tensor(transitions, device=discretizer.device))
        tokens = tokens.cpu()  # (N, T)
        transition_dim = tokens.shape[1]
        padded_lengths = lengths + length - 1
        total = int(padded_lengths.sum())
        padded_starts = np.concatenate([[0], np.cumsum(padded_lengths)[:-1]])
        # Map every real transition to its row in the padded layout.
        episode_of_row = np.repeat(np.arange(len(lengths)), lengths)
        first_row = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        offset_in_episode = np.arange(len(episode_of_row)) - first_row[episode_of_row]
        rows = torch.as_tensor(padded_starts[episode_of_row] + offset_in_episode)

        dtype = token_dtype(discretizer.n_bins)
        self.tokens = torch.zeros(total, transition_dim, dtype=dtype)  # (N + pad, T)
        self.tokens[rows] = tokens.to(dtype)
        self.valid = torch.zeros(total, dtype=torch.bool)  # (N + pad,)
        self.valid[rows] = True
        self.values = None  # (N + pad, T) float32, with real_values
        if real_values:
            self.values = torch.zeros(total, transition_dim)
            self.values[rows] = torch.as_tensor(transitions, dtype=torch.float32)
        self.starts = rows  # (W,) one window per real transition
        self.discretizer = discretizer  # the tokens' bins, for targets that read them
        self.sequence_transitions = length
        self.transition_dim = transition_dim
        self._offsets = torch.arange(length)

    def __len__(self) -> int:
        return len(self.starts)

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def _tensors(self) -> tuple[str, ...]:
        return ("tokens", "valid", "starts", "_offsets") + (
            ("values",) if self.values is not None else ()
        )

    @property
    def nbytes(self) -> int:
        """Memory held by the windows: tokens, real values, validity and window starts."""
        return sum(getattr(self, name).nbytes for name in self._tensors())

    def to(self, device: torch.device | str) -> TokenWindows:
        """The same windows with their tensors on `device` (self when they are there)."""
        device = torch.device(device)
        if device == self.device:
            return self
        moved = copy.copy(self)
        for name in self._tensors():
            setattr(moved, name, getattr(self, name).to(device))
        return moved

    def batch(
        self, window_ids: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Token sequences (B, L * T) as int64, their loss mask (B, L * T) and their real
        values (B, L * T) (None without `real_values`) for the given windows, on the windows'
        device."""
        window_ids = window_ids.to(self.device, non_blocking=True)
        rows = self.starts[window_ids, None] + self._offsets  # (B, L)
        tokens = self.tokens[rows].flatten(1).long()  # (B, L * T)
        mask = self.valid[rows].repeat_interleave(self.transition_dim, dim=1)  # (B, L * T)
        values = None if self.values is None else self.values[rows].flatten(1)  # (B, L * T)
        return tokens, mask, values
