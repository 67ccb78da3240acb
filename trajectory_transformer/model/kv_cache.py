"""Static key/value caches for incremental decoding (gpt-fast style), and their attention.

A cache's buffers are allocated once by its owner (a planner keeps one and reallocates it only
when it needs more rows) and written in place; rows (beams) are re-indexed with `reorder_`
and copied to their expansion copies with `repeat_rows_`. Nothing here grows with
`torch.cat` or syncs with the host.

A cache owns its layout and its attention: the model hands each layer's new queries, keys
and values to `attend`, which writes the keys and values and attends over everything cached
under the model's attention mask. A decode step goes through `attend_step` instead: its
position is a device tensor, and it attends over the whole buffer under that position's mask
row, so every step has the same shapes (gpt-fast's static cache) and never reads the position
on the host. `SharedPrefixKVCache` keeps one context per group of rows;
`RowLayout` is the one definition of how its rows are ordered, used by the cache, its
attention, the native kernel (through `native_layer`) and the planner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from einops import rearrange


class KVCache:
    """Projected keys and values of every layer, for `rows` sequences of up to `max_len` tokens.

    All rows advance in lock step, so callers track one shared position. Only the first
    `k.shape[0]` rows take part in an update, which lets one cache serve a context of E rows
    and later its E * beam_width beams. `mask` (at least max_len x max_len, bool) is the
    model's attention mask, needed by `attend`.
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
        mask: torch.Tensor | None = None,
    ) -> None:
        if min(n_layer, rows, n_head, max_len, head_dim) <= 0:
            raise ValueError(
                f"KVCache sizes must be positive, got n_layer={n_layer}, rows={rows}, "
                f"n_head={n_head}, max_len={max_len}, head_dim={head_dim}"
            )
        self.rows = rows
        self.max_len = max_len
        self.mask = mask
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

    def attend(
        self,
        layer: int,
        start: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """Cache `k`, `v` (B, nh, S, hs) at [start, start+S), then attend with `q` over [0,
        start+S) under the model's mask. Returns (B, nh, S, hs)."""
        if self.mask is None:
            raise ValueError("this cache has no attention mask; build it with model.new_cache")
        end = start + q.shape[2]
        k, v = self.update(layer, start, k, v)  # (B, nh, end, hs)
        mask = self.mask[start:end, :end]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)

    def attend_step(
        self, layer: int, position: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """One token per row: cache `k`, `v` (B, nh, 1, hs) at the device-held `position` (1,)
        and attend with `q` over the whole buffer, under the mask row of that position (which
        hides the positions not written yet). Same shapes at every position. (B, nh, 1, hs)."""
        rows = q.shape[0]
        keys, values = self.keys[layer, :rows], self.values[layer, :rows]  # (B, nh, M, hs)
        # Under autocast the new key and value come in the compute dtype, the cache keeps its own.
        keys.index_copy_(2, position, k.to(keys.dtype))
        values.index_copy_(2, position, v.to(values.dtype))
        mask = self.mask.index_select(0, position)[:, : self.max_len]  # (1, M)
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)

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
        for buf in (self.keys, self.values):
            gather_rows_(buf, parent, start, length, by_layer=buf.device.type == "cpu")

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


def gather_rows_(
    buf: torch.Tensor, parent: torch.Tensor, start: int, length: int, by_layer: bool
) -> None:
    """Row i of cache buffer `buf` (L, R, nh, M, hs) becomes old row `parent[i]`, over
    positions [start, length). `index_select` copies first, so overlapping rows are safe.

    `by_layer` gathers one layer at a time: on the CPU, index_select along a tensor's first
    dimension copies whole rows, about 4-10x faster than along the second
    (docs/results/planning-cpu.md, "A short spin, and beam reordering a layer at a time").
    Elsewhere one gather per buffer keeps
    the launches few and fixed.
    """
    n = parent.shape[0]
    if by_layer:
        for layer in buf:  # (R, nh, M, hs)
            layer[:n, :, start:length] = layer[:, :, start:length].index_select(0, parent)
    else:
        span = buf[:, :, :, start:length]  # (L, R, nh, length - start, hs)
        buf[:, :n, :, start:length] = span.index_select(1, parent)


@dataclass(frozen=True)
class RowLayout:
    """The order of a shared-prefix cache's rows: (copy, group, member).

    `groups` G rows share a prefix each (a planner's environments, each with its context),
    `members` M rows per group and copy (an environment's beams). Row r continues the prefix
    of group `(r // M) % G`; rows [0, G * M) are copy 0, and a step may run any whole number of
    copies from row 0 (a planner's expansion copies of every beam).
    """

    groups: int
    members: int

    @property
    def per_copy(self) -> int:
        return self.groups * self.members

    def copies(self, rows: int) -> int:
        """How many copies `rows` rows are; raises unless a whole number."""
        if rows <= 0 or rows % self.per_copy:
            raise ValueError(
                f"{rows} rows are not whole copies of {self.groups} groups x {self.members} "
                "rows per prefix"
            )
        return rows // self.per_copy

    def group_of_rows(self, rows: int, device: torch.device | str | None = None) -> torch.Tensor:
        """(rows,) int64: the group whose prefix each row continues."""
        return (torch.arange(rows, device=device) // self.members) % self.groups

    def by_group(self, x: torch.Tensor) -> torch.Tensor:
        """(X * G * M, ...) -> (G, X * M, ...): each group's rows, copy after copy."""
        return rearrange(x, "(x g m) ... -> g (x m) ...", g=self.groups, m=self.members)

    def rows_of(self, choice: torch.Tensor) -> torch.Tensor:
        """Rows (G * K,), group after group, of choices (G, K) among each group's X * M rows as
        `by_group` orders them."""
        group = torch.arange(self.groups, device=choice.device)[:, None]  # (G, 1)
        copy, member = choice // self.members, choice % self.members
        return (copy * self.per_copy + group * self.members + member).reshape(-1)

    def repeat(self, x: torch.Tensor, copies: int) -> torch.Tensor:
        """The rows of copy 0 (G * M, ...) in `copies` copies, as `repeat_rows_` lays out the
        cache: (copies * G * M, ...)."""
        return x.repeat(copies, *[1] * (x.dim() - 1))


def shared_prefix_attention(
    q: torch.Tensor,
    prefix_k: torch.Tensor,
    prefix_v: torch.Tensor,
    own_k: torch.Tensor,
    own_v: torch.Tensor,
    bias: torch.Tensor,
    layout: RowLayout,
) -> torch.Tensor:
    """Attention of rows over [their group's shared prefix ; their own keys], one softmax.

    q (R, nh, S, hs) for R = X * G * M rows in `layout` order; prefix_k/v (G, nh, P, hs);
    own_k/v (R, nh, L, hs); bias (S, P + L): the attention mask as an additive float, 0 where a
    query may attend and -inf elsewhere. The prefix part is one matmul per group over all its
    rows' queries, so the shared keys and values are read once per group, not once per row.
    The scores of both parts share one softmax. Returns (R, nh, S, hs).
    """
    S, hs = q.shape[2], q.shape[3]
    P = prefix_k.shape[2]
    G, M = layout.groups, layout.members
    grouped = rearrange(q, "(x g m) h s d -> g h (x m s) d", g=G, m=M)  # a group's queries
    prefix_scores = rearrange(
        grouped @ prefix_k.transpose(-1, -2), "g h (x m s) p -> x g m h s p", m=M, s=S
    )
    # Compiled, a row's products with its own keys are written as a product and a sum, which
    # fuse into one pass over the keys; as matmuls they are thousands of tiny matrix-vector
    # products, a poor fit for the GPU's libraries. Eager keeps the matmuls (no temporary).
    fused = torch.compiler.is_compiling()
    own_scores = (q[..., None, :] * own_k[:, :, None]).sum(-1) if fused else q @ own_k.mT
    own_scores = rearrange(own_scores, "(x g m) h s l -> x g m h s l", g=G, m=M)
    scores = torch.cat([prefix_scores, own_scores], dim=-1)  # (X, G, M, nh, S, P + L)
    probs = torch.add(bias, scores, alpha=hs**-0.5).softmax(dim=-1)
    prefix_probs = rearrange(probs[..., :P], "x g m h s p -> g h (x m s) p")
    y_prefix = rearrange(prefix_probs @ prefix_v, "g h (x m s) d -> x g m h s d", m=M, s=S)
    own_probs = rearrange(probs[..., P:], "x g m h s l -> (x g m) h s l")
    y_own = (own_probs[..., None] * own_v[:, :, None]).sum(-2) if fused else own_probs @ own_v
    y_own = rearrange(y_own, "(x g m) h s d -> x g m h s d", g=G, m=M)
    return rearrange(y_own + y_prefix, "x g m h s d -> (x g m) h s d")


class SharedPrefixKVCache:
    """A context shared by groups of rows, cached once per group, plus each row's own positions.

    Beam search runs many rows (beams) on top of one context per environment. Here the
    context's keys and values live once per group in `prefix` (a `KVCache` of `prefix_rows`
    rows), and each row caches only the positions after the context in `own` (a `KVCache` of
    `rows` rows whose position 0 is absolute position `prefix_length`). Attention over such a
    cache reads the context once per group instead of once per row, and beam selection copies
    only the rows' own positions. Rows are ordered by `layout` (a `RowLayout` whose number of
    groups is set by the prefill that writes the prefix).
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
        mask: torch.Tensor | None = None,
    ) -> None:
        if rows_per_prefix <= 0 or rows < prefix_rows * rows_per_prefix:
            raise ValueError(
                f"SharedPrefixKVCache needs rows_per_prefix > 0 and rows >= prefix_rows * "
                f"rows_per_prefix, got rows={rows}, prefix_rows={prefix_rows}, "
                f"rows_per_prefix={rows_per_prefix}"
            )
        self.prefix = KVCache(
            n_layer, prefix_rows, n_head, prefix_len, head_dim, device, dtype, mask
        )
        self.own = KVCache(n_layer, rows, n_head, own_len, head_dim, device, dtype)
        self.rows = rows
        self.layout = RowLayout(groups=0, members=rows_per_prefix)
        self.prefix_length = 0
        """Positions [0, prefix_length) are shared; set by the last prefix write."""
        self.prefix_end = torch.zeros(1, dtype=torch.long, device=device)
        """`prefix_length` on the device, for decode steps at device-held positions."""
        # The same mask as an additive bias, for the attention after the prefix; hidden
        # columns past the mask's keep a decode step's own slots beyond it out of reach.
        self._bias = None
        if mask is not None:
            bias = torch.zeros(mask.shape[0], mask.shape[1] + own_len, device=mask.device)
            self._bias = bias.masked_fill_(~F.pad(mask, (0, own_len)), float("-inf"))
        self._prefix_slots = torch.arange(prefix_len, device=device)  # (prefix_len,)
        self._own_slots = torch.arange(own_len, device=device)  # (own_len,)
        # Index tensors of a decode step's writes: (layer, row, head) broadcast to (R, nh).
        self._layer_index = torch.arange(n_layer, device=device)[:, None]
        self._row_index = torch.arange(rows, device=device)[:, None]
        self._head_index = torch.arange(n_head, device=device)[None]
        self._group_of_row: torch.Tensor | None = None

    @property
    def groups(self) -> int:
        """Prefix rows G written by the last prefix write."""
        return self.layout.groups

    @property
    def rows_per_prefix(self) -> int:
        return self.layout.members

    def update(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the shared prefix: `k`, `v` (G, nh, s, hs) at positions [0, s) of G groups.

        Replaces any previous prefix (and so invalidates the rows' own positions). Returns the
        prefix keys and values, (G, nh, s, hs), like `KVCache.update`.
        """
        self._begin_prefix(start, k)
        return self.prefix.update(layer, 0, k, v)

    def _begin_prefix(self, start: int, k: torch.Tensor) -> None:
        """The prefix's length and groups, from its keys (G, nh, s, hs) written at `start`."""
        if start != 0:
            raise ValueError(
                f"a shared prefix is written from position 0, not {start}; positions after it "
                "go through `extend`"
            )
        self.prefix_length = k.shape[2]
        self.prefix_end.fill_(self.prefix_length)
        if k.shape[0] != self.layout.groups:
            self.layout = RowLayout(groups=k.shape[0], members=self.layout.members)
            self._group_of_row = None

    def extend(
        self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Write `k`, `v` (R, nh, s, hs) of rows [0, R) at positions [start, start+s) after
        the prefix.

        Returns the prefix keys and values (G, nh, prefix_length, hs) and the rows' own keys
        and values over [prefix_length, start+s), (R, nh, start+s-prefix_length, hs).
        """
        keys, values = self.own.update(layer, self.own_position(start, k.shape[0]), k, v)
        P = self.prefix_length
        prefix = self.prefix.keys[layer, : self.groups, :, :P]
        prefix_values = self.prefix.values[layer, : self.groups, :, :P]
        return prefix, prefix_values, keys, values

    def attend(
        self,
        layer: int,
        start: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        dropout_p: float = 0.0,
    ) -> torch.Tensor:
        """From position 0, `q`, `k`, `v` (G, nh, S, hs) are the groups' shared prefix: cached
        once per group, attended like a plain cache. After it, they are (R, nh, S, hs) of the
        rows: cached in the rows' own positions and attended over [prefix ; own] with
        `shared_prefix_attention`. Returns (rows, nh, S, hs)."""
        if start == 0:
            self._begin_prefix(start, k)
            return self.prefix.attend(layer, 0, q, k, v, dropout_p)
        if self._bias is None:
            raise ValueError(
                "this cache has no attention mask; build it with model.new_shared_prefix_cache"
            )
        end = start + q.shape[2]
        prefix_k, prefix_v, k, v = self.extend(layer, start, k, v)
        bias = self._bias[start:end, :end]  # (S, end)
        return shared_prefix_attention(q, prefix_k, prefix_v, k, v, bias, self.layout)

    def attend_step(
        self, layer: int, position: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """One token per row at the device-held `position` (1,), after the prefix: cache `k`,
        `v` (R, nh, 1, hs) at the rows' own position and attend with `q` over the whole prefix
        and own buffers, under the mask row of `position` (prefix slots past the prefix and
        own positions not written yet are hidden). Same shapes at every position, no host
        sync. Returns (R, nh, 1, hs)."""
        rows, groups = q.shape[0], self.groups
        self.layout.copies(rows)  # raises unless whole copies: shapes only, no sync
        own_k, own_v = self.own.keys[layer, :rows], self.own.values[layer, :rows]
        # Written by index into the whole buffers, not through views of them: compiled, a
        # write through a view becomes a copy of the whole cache at every step.
        own = (position - self.prefix_end)[:, None]  # (1, 1)
        layer_index = self._layer_index[layer : layer + 1]  # (1, 1)
        where = (layer_index, self._row_index[:rows], self._head_index, own)  # -> (R, nh)
        self.own.keys.index_put_(where, k[:, :, 0].to(own_k.dtype))  # autocast's k: (R, nh, hs)
        self.own.values.index_put_(where, v[:, :, 0].to(own_v.dtype))
        row = self._bias.index_select(0, position)  # (1, block): this query's mask row
        prefix_bias = row[:, : self._prefix_slots.shape[0]].masked_fill(
            self._prefix_slots >= self.prefix_end, float("-inf")
        )  # (1, prefix_len)
        own_bias = row.index_select(1, self.prefix_end + self._own_slots)  # (1, own_len)
        bias = torch.cat([prefix_bias, own_bias], dim=1)
        prefix_k = self.prefix.keys[layer, :groups]  # (G, nh, prefix_len, hs)
        prefix_v = self.prefix.values[layer, :groups]
        return shared_prefix_attention(q, prefix_k, prefix_v, own_k, own_v, bias, self.layout)

    def own_position(self, position: int, rows: int) -> int:
        """Where absolute `position` of rows [0, rows) sits among the rows' own positions;
        raises unless those rows can write it after the shared prefix."""
        P = self.prefix_length
        if position < P or P == 0:
            raise ValueError(
                f"positions from {position} are not after the shared prefix [0, {P}); write "
                "the prefix first (a prefill from position 0)"
            )
        if rows > self.rows:
            raise ValueError(f"{rows} rows are more than the cache's {self.rows}")
        self.layout.copies(rows)
        if position - P >= self.own.max_len:
            raise ValueError(
                f"position {position} is past the cache's {self.max_len} positions; build a "
                "larger one"
            )
        return position - P

    def native_layer(
        self, layer: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One layer's whole buffers, for a kernel that writes the rows' keys and values
        itself (at `own_position`): prefix keys and values (prefix_rows, nh, prefix_len, hs),
        own keys and values (rows, nh, own_len, hs), contiguous."""
        prefix, own = self.prefix, self.own
        return prefix.keys[layer], prefix.values[layer], own.keys[layer], own.values[layer]

    def group_of_row(self) -> torch.Tensor:
        """(rows,) int64: the prefix row of every row, by `layout`; kept until the groups
        change."""
        if self._group_of_row is None:
            self._group_of_row = self.layout.group_of_rows(self.rows, self.own.device)
        return self._group_of_row

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
        positions [start, length); `rows` must be whole copies, so every copy keeps its group."""
        P = self.prefix_length
        start = P if start is None else start
        if start < P or self.groups == 0 or rows % self.layout.per_copy != 0:
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
