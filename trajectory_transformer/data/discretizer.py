"""Per-dimension discretisation of continuous transitions into tokens, in torch.

Each dimension j has `n_bins` tokens. Token k holds the values in `[edges[j, k], edges[j, k + 1])`
(values outside the fitted range clip to the first and last bin) and decodes to `values[j, k]`.

`uniform` spaces the edges evenly between the data's min and max; `quantile` puts an equal
share of the data in each bin. Real datasets hold point masses (actions saturated at their
bounds, sparse 0/1 rewards, a contact force that is mostly zero), where quantile edges repeat.
With `bin_values="mean"` (the default) such a point mass (a value holding a bin's share of the
data, or a repeated minimum or maximum) gets a bin of its own, the rest of the data is split by
quantiles, and no bin is left empty; a dimension may then use fewer tokens than `n_bins`
(`effective_bins`), and the unused ones sit at the top with zero width. Each token
decodes to the mean of the training values that fell in its bin (the conditional mean), so
a saturated action decodes to its bound and a certainly-zero reward to exactly 0. A bin the
data never reached (possible with uniform bins) decodes to its midpoint. Uniform bins keep
their equal widths and get the conditional means too: it is the decoding of least squared
error for the training data whichever the edges.

Modes far apart keep bins of their own (quantile bins, `bin_values="mean"`): no bin spans a
gap between consecutive data values that separates two modes. A gap separates modes when it
is wider than `FAR_GAP` times the spread on either side of it (the wider), measured twice:
over all the data on that side (its interquartile range), and over the `NEIGHBOURS` values
next to the gap (their range). The search is recursive: once a column is cut, each part is
searched again with its own data on either side, so a ladder of levels (a game's scores, a
shaped bonus, penalties of several sizes) loses its levels one by one from the outside, each
judged against its neighbours rather than against the whole ladder. Without this, a rare
outcome far from the bulk (a fall's terminal penalty, a goal bonus, a crash) shares the lowest
or highest quantile bin with the bulk's extremes and decodes to a fraction of itself; with it,
each mode gets at least one bin and decodes to its own mean. The cuts are kept (`mode_cuts`),
and `rare_modes` describes the modes they made that hold fewer values than one quantile bin.
At most `n_bins // MODES_PER_BINS` cuts are kept per dimension, the widest relative to their
spread first; where a column has more far modes than that, the rest share bins with their
neighbours, and `fit` warns, naming the dimension and a number of bins that would keep them.
A level needs about `NEIGHBOURS` values to be told from a continuous tail.

`bin_values="midpoint"` is the original code's scheme: quantile edges as they fall, every token
decoded to its bin's midpoint. Checkpoints of format 1 decode this way, as they were trained.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import numpy as np
import torch

STRATEGIES = ("uniform", "quantile")
BIN_VALUES = ("mean", "midpoint")
MAX_BINS = 65_536
"""Bins per dimension at most: a token fits 16 bits, and the model's embedding and heads stay
within reach (each is transition dims x bins x width)."""
FAR_GAP = 5.0
"""A gap between consecutive values wider than this many times the spread on either side of it
(the wider; see the module docstring) separates two modes, and no bin spans it. Of 100k values
drawn from a normal, an exponential or a Student's t with 5 degrees of freedom, essentially
never; from a lognormal or a t with 3, about one column in 20 loses its most extreme values to
bins of their own; from a Cauchy, 2 in 5."""
NEIGHBOURS = 10
"""The values next to a gap, on either side, whose range is its local spread."""
MODES_PER_BINS = 4
"""At most `n_bins // MODES_PER_BINS` gaps (the widest, relative to their sides) split a
dimension, so that the bulk keeps most of its bins whatever the tails hold."""


@dataclass(frozen=True)
class RareMode:
    """A mode of one dimension far from the rest of its data and holding fewer values than a
    quantile bin: its range, how many training values it holds, their mean, and the mean of
    those values after a round trip through the tokens."""

    low: float
    high: float
    count: int
    mean: float
    decoded_mean: float


class Discretizer:
    def __init__(
        self,
        edges: torch.Tensor,
        strategy: str = "quantile",
        values: torch.Tensor | None = None,
        effective_bins: torch.Tensor | None = None,
        bin_values: str = "midpoint",
        mean: torch.Tensor | None = None,
        std: torch.Tensor | None = None,
        mode_cuts: list[list[float]] | None = None,
    ) -> None:
        """`edges` (D, N + 1) non-decreasing; `values` (D, N) what each token decodes to
        (default: bin midpoints); `effective_bins` (D,) tokens in use per dimension, the lowest
        ones (default: all N); `mean` and `std` (D,) of the data it was fitted to (a model's
        value inputs are normalised by them; checkpoints before format 3 have none);
        `mode_cuts` per dimension, the values that separate its far modes (see the module
        docstring; None where unknown, as in checkpoints before format 3)."""
        if edges.ndim != 2 or edges.shape[1] < 2:
            raise ValueError(f"edges must be (dims, n_bins + 1), got {tuple(edges.shape)}")
        self.strategy = strategy
        self.bin_values = bin_values
        self.edges = edges.to(torch.float32)  # (D, N + 1)
        D, N = self.edges.shape[0], self.edges.shape[1] - 1
        midpoints = 0.5 * (self.edges[:, 1:] + self.edges[:, :-1])  # (D, N)
        self.values = midpoints if values is None else values.to(self.edges)  # (D, N)
        if effective_bins is None:
            effective_bins = torch.full((D,), N, dtype=torch.long)
        self.effective_bins = effective_bins.to(device=self.edges.device, dtype=torch.long)
        self.mean = None if mean is None else mean.to(self.edges)  # (D,)
        self.std = None if std is None else std.to(self.edges)  # (D,)
        self.mode_cuts = mode_cuts
        # Token k starts at threshold k - 1: searchsorted over the inner edges of the bins in
        # use gives 0..bins-1 with clipping at both ends; +inf keeps unused tokens unreachable.
        inner = torch.arange(1, N, device=self.edges.device)  # (N - 1,)
        in_use = inner[None, :] < self.effective_bins[:, None]  # (D, N - 1)
        self._thresholds = torch.where(
            in_use, self.edges[:, 1:-1], torch.full_like(self.edges[:, 1:-1], torch.inf)
        ).contiguous()

    @classmethod
    def fit(
        cls,
        data: np.ndarray,
        n_bins: int = 100,
        strategy: str = "quantile",
        bin_values: str = "mean",
    ) -> Discretizer:
        """Fit edges, and with `bin_values="mean"` the decoded values, to `data` (rows, dims),
        each dimension on its own."""
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown discretizer {strategy!r}; choose one of {STRATEGIES}")
        if bin_values not in BIN_VALUES:
            raise ValueError(f"unknown bin_values {bin_values!r}; choose one of {BIN_VALUES}")
        if not 2 <= n_bins <= MAX_BINS:
            raise ValueError(f"n_bins must be in [2, {MAX_BINS}], got {n_bins}")
        # Encoding runs in float32, so the bins are fitted to the float32 values.
        data = np.asarray(data, dtype=np.float32)
        if data.ndim != 2 or len(data) == 0:
            raise ValueError(f"data must be (rows, dims) with rows, got shape {data.shape}")
        bad = ~np.isfinite(data)
        if bad.any():
            dim = int(np.argmax(bad.any(axis=0)))
            raise ValueError(
                f"the data holds {int(bad.sum())} non-finite values (NaN or inf), the first in "
                f"dimension {dim} at row {int(np.argmax(bad[:, dim]))}: a bin cannot hold them. "
                "Clean or drop the episodes that hold them before training."
            )
        moments = {
            "mean": torch.from_numpy(data.mean(axis=0, dtype=np.float64).astype(np.float32)),
            "std": torch.from_numpy(data.std(axis=0, dtype=np.float64).astype(np.float32)),
        }
        if strategy == "uniform":
            low, high = data.min(axis=0), data.max(axis=0)
            grid = np.linspace(low, high, n_bins + 1, axis=1).astype(np.float32)  # (D, N + 1)
        elif bin_values == "midpoint":
            levels = np.linspace(0.0, 1.0, n_bins + 1)
            grid = np.quantile(data.astype(np.float64), levels, axis=0).T.astype(np.float32)
        if bin_values == "midpoint":
            return cls(torch.from_numpy(grid), strategy, bin_values="midpoint", **moments)

        D = data.shape[1]
        edges = np.empty((D, n_bins + 1), dtype=np.float32)
        values = np.empty((D, n_bins), dtype=np.float32)
        effective_bins = np.empty(D, dtype=np.int64)
        mode_cuts: list[list[float]] = []
        for j, column in enumerate(data.T):
            if strategy == "uniform":
                bounds, cuts = grid[j], np.zeros(0, dtype=np.float32)
            else:
                bounds, cuts, found = _quantile_bounds(column, n_bins)
                if found > len(cuts):
                    warnings.warn(
                        f"dimension {j} has {found + 1} modes far apart, more than the "
                        f"{len(cuts) + 1} that {n_bins} bins keep apart (n_bins // "
                        f"{MODES_PER_BINS} cuts): the others share bins with their neighbours. "
                        f"dataset.n_bins={MODES_PER_BINS * found} keeps them all",
                        UserWarning,
                        stacklevel=2,
                    )
            edges[j], values[j], effective_bins[j] = _conditional_means(bounds, column, n_bins)
            mode_cuts.append(cuts.tolist())
        return cls(
            torch.from_numpy(edges),
            strategy,
            torch.from_numpy(values),
            torch.from_numpy(effective_bins),
            bin_values="mean",
            **moments,
            mode_cuts=mode_cuts,
        )

    @property
    def n_bins(self) -> int:
        return self.values.shape[1]

    @property
    def dims(self) -> int:
        return self.values.shape[0]

    @property
    def device(self) -> torch.device:
        return self.edges.device

    def to(self, device: torch.device | str) -> Discretizer:
        return Discretizer(
            self.edges.to(device),
            self.strategy,
            self.values.to(device),
            self.effective_bins.to(device),
            self.bin_values,
            self.mean,
            self.std,
            self.mode_cuts,
        )

    def value_normalisation(self) -> tuple[torch.Tensor, ...]:
        """(low, high, loc, scale), each (D,): how a model's value inputs are normalised.
        Values clip to the fitted range [low, high], as tokens clip to the edge bins, then
        are centred on the data's mean and divided by its standard deviation (1 for a
        constant dimension)."""
        if self.mean is None or self.std is None:
            raise ValueError(
                "this discretizer does not know its data's mean and spread (a checkpoint of "
                "format 1 or 2): fit a new one for a model with value inputs"
            )
        low, high = self.fitted_range()
        scale = torch.where(self.std > 0, self.std, torch.ones_like(self.std))
        return low, high, self.mean, scale

    def fitted_range(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(low, high), each (D,): the range the bins cover, from the first bin's lower edge
        to the last bin in use's upper edge. A value outside it encodes as an edge bin."""
        top = (self.effective_bins - 1).clamp_min(0)[:, None]  # (D, 1): the last bin in use
        return self.edges[:, 0], self.edges.gather(1, top + 1)[:, 0]

    def _dims(self, dims: slice | torch.Tensor | None) -> slice | torch.Tensor:
        return slice(None) if dims is None else dims

    def encode(self, x: torch.Tensor, dims: slice | torch.Tensor | None = None) -> torch.Tensor:
        """Values (..., D') -> tokens (..., D') int64, for dimensions `dims` (default all)."""
        thresholds = self._thresholds[self._dims(dims)]  # (D', N - 1)
        flat = x.to(thresholds).reshape(-1, thresholds.shape[0]).T.contiguous()  # (D', M)
        tokens = torch.searchsorted(thresholds, flat, right=True)  # (D', M)
        return tokens.T.reshape(x.shape)

    def decode(
        self, tokens: torch.Tensor, dims: slice | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Tokens (..., D') -> decoded values (..., D') float32."""
        values = self.values[self._dims(dims)]  # (D', N)
        flat = tokens.reshape(-1, values.shape[0]).T  # (D', M)
        return torch.gather(values, 1, flat).T.reshape(tokens.shape)

    def expectation(
        self, probs: torch.Tensor, dim: int, percentile: float | None = None
    ) -> torch.Tensor:
        """Mean (or a percentile) of dimension `dim` under token probabilities (..., N)."""
        values = self.values[dim]  # (N,)
        if percentile is None:
            return probs @ values
        # The smallest bin whose cumulative probability reaches the percentile.
        cdf = probs.cumsum(dim=-1)
        index = torch.searchsorted(cdf, torch.full_like(cdf[..., :1], percentile)).clamp_(
            max=self.n_bins - 1
        )
        return values[index.squeeze(-1)]

    def reconstruction_error(self, data: np.ndarray) -> np.ndarray:
        """Mean absolute round-trip error per dimension, in standard deviations of the data
        (in the data's own units for a constant dimension)."""
        data = np.asarray(data, dtype=np.float32)
        x = torch.as_tensor(data, device=self.device)
        error = (self.decode(self.encode(x)) - x).abs().mean(dim=0).cpu().numpy()
        spread = data.std(axis=0, dtype=np.float64)
        return error / np.where(spread > 0, spread, 1.0)

    def rare_modes(self, data: np.ndarray, dim: int) -> list[RareMode]:
        """The rare far modes of dimension `dim` of `data` (rows, dims), lowest first, with
        what their values decode to: the parts of the column between the cuts that `fit`
        made (`mode_cuts`) that hold fewer values than a quantile bin. A check that rare
        outcomes keep their own bins; empty where no cuts are known."""
        if self.mode_cuts is None or not self.mode_cuts[dim]:
            return []
        column = np.sort(np.asarray(data, dtype=np.float32)[:, dim])
        splits = np.searchsorted(column, np.asarray(self.mode_cuts[dim], np.float32), "left")
        modes = []
        for part in np.split(column, splits):
            if len(part) == 0 or len(part) >= len(column) / self.n_bins:
                continue
            x = torch.as_tensor(part[:, None], device=self.device)
            decoded = self.decode(self.encode(x, slice(dim, dim + 1)), slice(dim, dim + 1))
            modes.append(
                RareMode(
                    low=float(part[0]),
                    high=float(part[-1]),
                    count=len(part),
                    mean=float(part.astype(np.float64).mean()),
                    decoded_mean=float(decoded.double().mean()),
                )
            )
        return modes

    def state_dict(self) -> dict:
        return {
            "edges": self.edges.cpu(),
            "values": self.values.cpu(),
            "effective_bins": self.effective_bins.cpu(),
            "strategy": self.strategy,
            "bin_values": self.bin_values,
            **({} if self.mean is None else {"mean": self.mean.cpu(), "std": self.std.cpu()}),
            **({} if self.mode_cuts is None else {"mode_cuts": self.mode_cuts}),
        }

    @classmethod
    def from_state_dict(cls, state: dict) -> Discretizer:
        """Also reads the state of format-1 checkpoints (edges only): midpoints, all bins."""
        return cls(
            state["edges"],
            state["strategy"],
            state.get("values"),
            state.get("effective_bins"),
            state.get("bin_values", "midpoint"),
            state.get("mean"),
            state.get("std"),
            state.get("mode_cuts"),
        )


def _quantile_bounds(column: np.ndarray, n_bins: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Boundaries (at most N + 1) of quantile bins for one dimension, point masses and far
    modes apart; the cuts between the modes (`_mode_cuts`), and how many far gaps were found.

    A point mass is a value that holds a bin's share of the data or more (where quantile edges
    would repeat), or a repeated minimum or maximum (an action saturated at its bound). Each
    gets the bin `[value, next float32)` of its own; the remaining data is split by quantiles
    into the bins left over, no bin spanning a cut, and a bin left empty between two others
    joins the one below.
    """
    cuts, found = _mode_cuts(np.sort(column), n_bins)
    values, counts = np.unique(column, return_counts=True)
    heavy = counts >= len(column) / n_bins
    heavy[[0, -1]] |= counts[[0, -1]] >= 2
    masses = values[heavy]
    rest = column[~np.isin(column, masses)]
    if len(rest):
        inside = np.count_nonzero((masses > rest.min()) & (masses < rest.max()))
        # A mass inside the rest's range splits one of its bins in three, one outside adds one.
        left = n_bins - 2 * inside - (len(masses) - inside)
    if (len(rest) and left < 1) or len(masses) > n_bins:  # too many masses: edges as they fall
        masses, rest, left = masses[:0], column, n_bins
    bounds = [masses, np.nextafter(masses, np.float32(np.inf))]
    if len(rest):
        edges = _mode_edges(np.sort(rest), left, cuts)
        if len(masses) and masses[-1] > rest.max():
            edges = edges[:-1]  # the mass above closes the top bin; the maximum of the rest
            # as a boundary would give it a bin of its own
        bounds.append(edges.astype(np.float32))
    bounds = np.unique(np.concatenate(bounds))
    if len(bounds) == 1:  # one value, not repeated: a bin of its own all the same
        bounds = np.append(bounds, np.nextafter(bounds[0], np.float32(np.inf)))
    tokens = np.searchsorted(bounds[1:-1], column, side="right")
    filled = np.bincount(tokens, minlength=len(bounds) - 1) > 0
    # The first bin holds the minimum; each later empty bin joins the bin below it.
    return bounds[np.concatenate([[True], filled[1:], [True]])], cuts, found


def _conditional_means(
    bounds: np.ndarray, column: np.ndarray, n_bins: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """Edges (N + 1,), decoded values (N,) and the number of bins in use, from the boundaries
    of the bins in use: unused tokens are zero-width bins at the top; each token decodes to
    the mean of the data in its bin, or to its midpoint where it holds none."""
    used = len(bounds) - 1
    edges = np.concatenate([bounds, np.full(n_bins - used, bounds[-1], dtype=np.float32)])
    tokens = np.searchsorted(bounds[1:-1], column, side="right")
    counts = np.bincount(tokens, minlength=n_bins)
    sums = np.bincount(tokens, weights=column, minlength=n_bins)
    midpoints = 0.5 * (edges[1:].astype(np.float64) + edges[:-1])
    values = np.where(counts > 0, sums / np.maximum(counts, 1), midpoints)
    return edges, values.astype(np.float32), used


def _two_sided_iqr(x: np.ndarray) -> np.ndarray:
    """For each gap i of a sorted array, the wider interquartile range of x[:i + 1] and
    x[i + 1:]."""
    n = len(x)
    below = np.arange(1, n)  # values on the lower side of gap i: x[:i + 1]
    above = n - below  # and on the upper side: x[i + 1:]

    def iqr(first: np.ndarray, size: np.ndarray) -> np.ndarray:  # of x[first : first + size]
        quartile = lambda q: x[first + np.round(q * (size - 1)).astype(np.int64)]  # noqa: E731
        return quartile(0.75) - quartile(0.25)

    return np.maximum(iqr(np.zeros(n - 1, dtype=np.int64), below), iqr(below, above))


def _far_gaps(column: np.ndarray, n_bins: int) -> tuple[np.ndarray, int]:
    """Indices i (ascending) of the gaps (column[i], column[i + 1]) of a sorted column that
    separate modes (see the module docstring), at most `n_bins // MODES_PER_BINS` of them, the
    widest relative to their spread first; and how many were found."""
    x = column.astype(np.float64)
    n = len(x)
    limit = n_bins // MODES_PER_BINS
    if n < 2 or limit < 1:
        return np.zeros(0, dtype=np.int64), 0
    gap = x[1:] - x[:-1]
    i = np.arange(n - 1)
    # The range of the NEIGHBOURS values on either side of each gap, the wider.
    local = np.maximum(
        x[i] - x[np.maximum(i - NEIGHBOURS + 1, 0)], x[np.minimum(i + NEIGHBOURS, n - 1)] - x[i + 1]
    )
    ratios: dict[int, float] = {}
    parts = [(0, n)]
    while parts and len(ratios) < 4 * limit:  # a few more than kept, to keep the widest
        a, b = parts.pop()
        if b - a < 2:
            continue
        scale = np.maximum(_two_sided_iqr(x[a:b]), local[a : b - 1])
        far = np.flatnonzero(gap[a : b - 1] > FAR_GAP * scale)
        if len(far) == 0:
            continue
        with np.errstate(divide="ignore"):  # inf where both sides are constant
            ratio = gap[a + far] / scale[far]
        ratios.update(zip((far + a).tolist(), ratio.tolist(), strict=True))
        parts += list(itertools.pairwise([a, *(far + a + 1).tolist(), b]))
    found = np.array(sorted(ratios), dtype=np.int64)
    if len(found) > limit:
        ratio = np.array([ratios[k] for k in found])
        found = np.sort(found[np.lexsort((-gap[found], -ratio))[:limit]])
    return found, len(ratios)


def _mode_cuts(column: np.ndarray, n_bins: int) -> tuple[np.ndarray, int]:
    """The values (float32, ascending) that separate the modes of a sorted float32 column, each
    halfway across its gap (and above the value below it); and how many far gaps were found."""
    far, found = _far_gaps(column, n_bins)
    low, high = column[far], column[far + 1]
    halfway = (0.5 * (low.astype(np.float64) + high)).astype(np.float32)
    return np.maximum(halfway, np.nextafter(low, np.float32(np.inf))), found


def _mode_edges(rest: np.ndarray, bins: int, cuts: np.ndarray) -> np.ndarray:
    """Boundaries (bins + 1) of quantile bins over a sorted column in which no bin spans one of
    the `cuts` between modes: each mode gets one bin, the bins left over go to the modes by
    their share of the data (largest remainders), each is split by its own quantiles, and two
    modes meet at their cut. Without cuts these are the plain quantile edges."""
    splits = np.searchsorted(rest, cuts, side="left")  # the first value above each cut
    inside = (splits > 0) & (splits < len(rest))
    splits, at = np.unique(splits[inside], return_index=True)
    splits, boundaries = splits[: bins - 1], cuts[inside][at][: bins - 1]
    parts = np.split(rest.astype(np.float64), splits)
    counts = np.array([len(part) for part in parts], dtype=np.float64)
    share = (bins - len(parts)) * counts / counts.sum()
    extra = np.floor(share).astype(np.int64)
    remainder = bins - len(parts) - int(extra.sum())
    extra[np.argsort(-(share - extra), kind="stable")[:remainder]] += 1
    edges = [parts[0][:1]]
    for i, (part, n) in enumerate(zip(parts, extra + 1, strict=True)):
        edges.append(np.quantile(part, np.linspace(0.0, 1.0, n + 1))[1:-1])
        if i + 1 < len(parts):  # the cut between this mode and the next
            edges.append(boundaries[i : i + 1])
    edges.append(parts[-1][-1:])
    return np.concatenate(edges)
