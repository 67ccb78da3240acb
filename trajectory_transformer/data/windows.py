"""Training windows: `L` consecutive transitions of one episode, tokenised once up front.

The whole dataset is tokenised a single time into one array in which every episode is
followed by `L - 1` padding rows, so a window starting at any step of an episode is a plain
slice that never crosses into the next episode. A batch is one gather of those slices.
"""

from __future__ import annotations

import numpy as np
import torch

from trajectory_transformer.data.discretizer import Discretizer


class TokenWindows:
    """All windows of a dataset; window i starts at transition `starts[i]` of its episode."""

    def __init__(
        self,
        transitions: np.ndarray,
        lengths: np.ndarray,
        discretizer: Discretizer,
        sequence_transitions: int,
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

        self.tokens = torch.zeros(total, transition_dim, dtype=torch.long)  # (N + pad, T)
        self.tokens[rows] = tokens
        self.valid = torch.zeros(total, dtype=torch.bool)  # (N + pad,)
        self.valid[rows] = True
        self.starts = rows  # (W,) one window per real transition
        self.sequence_transitions = length
        self.transition_dim = transition_dim
        self._offsets = torch.arange(length)

    def __len__(self) -> int:
        return len(self.starts)

    def batch(self, window_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Token sequences (B, L * T) and their loss mask (B, L * T) for the given windows."""
        rows = self.starts[window_ids, None] + self._offsets  # (B, L)
        tokens = self.tokens[rows].flatten(1)  # (B, L * T)
        mask = self.valid[rows].repeat_interleave(self.transition_dim, dim=1)  # (B, L * T)
        return tokens, mask
