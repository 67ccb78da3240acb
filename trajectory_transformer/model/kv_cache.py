"""Static key/value cache for incremental decoding (gpt-fast style).

Buffers are allocated once per planning call and written in place; rows (beams) are
re-indexed with `reorder_` and copied to their expansion copies with `repeat_rows_`. Nothing
here grows with `torch.cat` or syncs with the host.
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

    @torch.no_grad()
    def repeat_rows_(self, rows: int, copies: int, length: int, start: int = 0) -> None:
        """Rows [0, rows) repeated `copies` times, as `Tensor.repeat` would lay them out: row
        `c * rows + i` becomes row i, for positions [start, length) only.

        A plain copy: cheaper than `reorder_` with the parent `arange(rows).repeat(copies)`,
        which gathers through a temporary and also rewrites the first `rows` rows.
        """
        if rows * copies > self.rows or length > self.max_len or not 0 <= start <= length:
            raise ValueError(
                f"repeat_rows_ of {rows} rows x {copies} copies over positions [{start}, "
                f"{length}) exceeds the cache ({self.rows} rows x {self.max_len} positions)"
            )
        for buf in (self.keys, self.values):
            source = buf[:, :rows, :, start:length]  # (L, rows, nh, length - start, hs)
            for copy in range(1, copies):
                buf[:, copy * rows : (copy + 1) * rows, :, start:length] = source

    @property
    def device(self) -> torch.device:
        return self.keys.device

    @property
    def dtype(self) -> torch.dtype:
        return self.keys.dtype


class SharedPrefixKVCache:
    """A context shared by groups of rows, cached once per group, plus each row's own positions.

    Beam search runs many rows (beams) on top of one context per environment. Here the
    context's keys and values live once per group in `prefix` (a `KVCache` of `prefix_rows`
    rows), and each row caches only the positions after the context in `own` (a `KVCache` of
    `rows` rows whose position 0 is absolute position `prefix_length`). Attention over such a
    cache reads the context once per group instead of once per row, and beam selection copies
    only the rows' own positions.

    Row layout: with G prefix rows written by the last `update` (G <= prefix_rows), row r
    continues prefix row `(r // rows_per_prefix) % G`, i.e. rows are ordered (copy, group,
    member) with `rows_per_prefix` members per group; any multiple of G * rows_per_prefix rows
    (starting at row 0) can take part in a step.
    """

    def __init__(
        self,
        n_layer: int,
        prefix_rows: int,
        rows_per_prefix: int,
        rows: int,
        n_head: int,
        prefix_len: int,
        own_len: int,
        head_dim: int,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if rows_per_prefix <= 0 or rows < prefix_rows * rows_per_prefix:
            raise ValueError(
                f"SharedPrefixKVCache needs rows_per_prefix > 0 and rows >= prefix_rows * "
                f"rows_per_prefix, got rows={rows}, prefix_rows={prefix_rows}, "
                f"rows_per_prefix={rows_per_prefix}"
            )
        self.prefix = KVCache(n_layer, prefix_rows, n_head, prefix_len, head_dim, device, dtype)
        self.own = KVCache(n_layer, rows, n_head, own_len, head_dim, device, dtype)
        self.rows_per_prefix = rows_per_prefix
        self.rows = rows
        self.prefix_length = 0
        """Positions [0, prefix_length) are shared; set by the last `update`."""
        self.groups = 0
        """Prefix rows G written by the last `update`."""

    def update(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the shared prefix: `k`, `v` (G, nh, s, hs) at positions [0, s) of G groups.

        Replaces any previous prefix (and so invalidates the rows' own positions). Returns the
        prefix keys and values, (G, nh, s, hs), like `KVCache.update`.
        """
        if start != 0:
            raise ValueError(
                f"a shared prefix is written from position 0, not {start}; positions after it "
                "go through `extend`"
            )
        self.prefix_length, self.groups = k.shape[2], k.shape[0]
        return self.prefix.update(layer, 0, k, v)

    def extend(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write `k`, `v` (R, nh, s, hs) of rows [0, R) at positions [start, start+s) after
        the prefix.

        Returns the prefix keys and values (G, nh, prefix_length, hs) and the rows' own keys
        and values over [prefix_length, start+s), (R, nh, start+s-prefix_length, hs).
        """
        self.check_extension(start, k.shape[0])
        P = self.prefix_length
        keys, values = self.own.update(layer, start - P, k, v)
        prefix = self.prefix.keys[layer, : self.groups, :, :P]
        prefix_values = self.prefix.values[layer, : self.groups, :, :P]
        return prefix, prefix_values, keys, values

    def layer_buffers(
        self, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The whole buffers of one layer, for a kernel that writes the rows' positions itself:
        prefix keys and values (prefix_rows, nh, prefix_len, hs) and own keys and values
        (rows, nh, own_len, hs), contiguous. Own position i is absolute position
        `prefix_length + i`; `check_extension` first."""
        prefix, own = self.prefix, self.own
        return prefix.keys[layer], prefix.values[layer], own.keys[layer], own.values[layer]

    def check_extension(self, start: int, rows: int) -> None:
        """Raise unless rows [0, rows) can write position `start` after the shared prefix."""
        P = self.prefix_length
        if start < P or P == 0:
            raise ValueError(
                f"positions from {start} are not after the shared prefix [0, {P}); write the "
                "prefix first (a prefill from position 0)"
            )
        if rows % (self.groups * self.rows_per_prefix) != 0 or rows > self.rows:
            raise ValueError(
                f"{rows} rows are not whole copies of {self.groups} groups x "
                f"{self.rows_per_prefix} rows per prefix within the cache's {self.rows} rows"
            )
        if start - P >= self.own.max_len:
            raise ValueError(
                f"position {start} is past the cache's {self.max_len} positions; build a larger one"
            )

    def reorder_(self, parent: torch.Tensor, length: int, start: int | None = None) -> None:
        """Row i becomes old row `parent[i]` at absolute positions [start, length).

        Only the rows' own positions move (`start` defaults to the end of the prefix and may
        not lie before it); `parent` must keep every row in its group.
        """
        P = self.prefix_length
        start = P if start is None else start
        if start < P:
            raise ValueError(
                f"reorder_ from position {start} would move the shared prefix [0, {P}); rows "
                "share it, so start at or after it"
            )
        self.own.reorder_(parent, length - P, start - P)

    def repeat_rows_(self, rows: int, copies: int, length: int, start: int | None = None) -> None:
        """Rows [0, rows) repeated `copies` times (see `KVCache.repeat_rows_`) at absolute
        positions [start, length); `rows` must be whole groups, so every copy keeps its group."""
        P = self.prefix_length
        start = P if start is None else start
        if start < P or rows % (self.groups * self.rows_per_prefix) != 0:
            raise ValueError(
                f"repeat_rows_ of {rows} rows from position {start} must copy whole groups of "
                f"{self.groups} x {self.rows_per_prefix} rows after the shared prefix [0, {P})"
            )
        self.own.repeat_rows_(rows, copies, length - P, start - P)

    @property
    def max_len(self) -> int:
        return self.prefix_length + self.own.max_len

    @property
    def device(self) -> torch.device:
        return self.own.device

    @property
    def dtype(self) -> torch.dtype:
        return self.own.dtype
