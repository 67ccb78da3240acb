"""Static key/value cache for incremental decoding (gpt-fast style).

Buffers are allocated once per planning call and written in place; rows (beams) are
re-indexed with `reorder_`. Nothing here grows with `torch.cat` or syncs with the host.
"""

from __future__ import annotations

import torch


class KVCache:
    """Projected keys and values of every layer, for `rows` sequences of up to `max_len` tokens.

    All rows advance in lock step, so callers track one shared position. Only the first
    `k.shape[0]` rows take part in an update, which lets one cache serve a context of E rows
    and later its E * beam_width beams.
    """

    def __init__(
        self,
        n_layer: int,
        rows: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if min(n_layer, rows, n_head, max_len, head_dim) <= 0:
            raise ValueError(
                f"KVCache sizes must be positive, got n_layer={n_layer}, rows={rows}, "
                f"n_head={n_head}, max_len={max_len}, head_dim={head_dim}"
            )
        self.rows = rows
        self.max_len = max_len
        shape = (n_layer, rows, n_head, max_len, head_dim)
        self.keys = torch.zeros(shape, device=device, dtype=dtype)  # (L, R, nh, M, hs)
        self.values = torch.zeros(shape, device=device, dtype=dtype)  # (L, R, nh, M, hs)

    def update(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write `k`, `v` (B, nh, s, hs) at positions [start, start+s) of rows [0, B).

        Returns views of the cached keys and values over [0, start+s), shape (B, nh, start+s, hs).
        """
        rows, end = k.shape[0], start + k.shape[2]
        if rows > self.rows or end > self.max_len or start < 0:
            raise ValueError(
                f"cache write of {rows} rows at positions [{start}, {end}) does not fit a cache "
                f"of {self.rows} rows x {self.max_len} positions; build a larger one with "
                "model.new_cache(rows, max_len)"
            )
        keys, values = self.keys[layer, :rows], self.values[layer, :rows]  # (B, nh, M, hs)
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        return keys[:, :, :end], values[:, :, :end]

    @torch.no_grad()
    def reorder_(self, parent: torch.Tensor, length: int, start: int = 0) -> None:
        """Row i becomes old row `parent[i]`, for positions [start, length) only.

        `parent` may be longer than the rows in use (one context row broadcast to its beams),
        but not longer than the cache's capacity. A `start` > 0 skips positions known to be
        equal in every parent and child row (a planner's shared context).
        """
        n = parent.shape[0]
        if n > self.rows or length > self.max_len or not 0 <= start <= length:
            raise ValueError(
                f"reorder_ to {n} rows over positions [{start}, {length}) exceeds the cache "
                f"({self.rows} rows x {self.max_len} positions)"
            )
        # index_select copies first, so overlapping source and target rows are safe. One layer
        # at a time gathers along the outermost dimension, about twice as fast on CPU.
        for buf in (self.keys, self.values):
            for layer in buf:  # (R, nh, M, hs)
                span = layer[:, :, start:length]  # (R, nh, length - start, hs)
                layer[:n, :, start:length] = span.index_select(0, parent)

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype
