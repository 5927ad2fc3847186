"""The one sample form every statistic reads: per time unit, a histogram on the fixed log grid plus
exact sums.

A window of one arm and metric is an `ArmSample`, whether it came from the store's summaries
(`stats.job.frame`) or from rows (`ArmSample.from_values`, the same binning as the writer's), so
each estimator exists once. A value stands for its bin's geometric centre: every order statistic
is within `grid_error` of the exact one, the mean is exact (sums). `ArmWindow` holds one arm's
samples of a window; `Pairs` the mirrored pairs, the one input that stays per request.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from specproxy.stats.estimate.quantile import QUANTILE_LEVELS
from specproxy.summary.grid import GRID_ERROR_BOUND, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_index, bin_log_centres

__all__ = ["ArmSample", "ArmWindow", "Pairs", "unique_inverse"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def unique_inverse(bins: IntArray) -> tuple[IntArray, IntArray]:
    """`np.unique(bins, return_inverse=True)` without the sort when the bins span a range not
    much wider than their number (always, for latencies: a 30-day window holds ~1M entries over
    ~50k grid bins), through a dense occupancy map; the sort otherwise."""
    if bins.size == 0:
        return bins.astype(np.int64), bins.astype(np.int64)
    lo = int(bins.min())
    span = int(bins.max()) - lo + 1
    if span > 4 * bins.size + (1 << 16):
        grid, inverse = np.unique(bins, return_inverse=True)
        return grid, inverse.astype(np.int64)
    occupied = np.zeros(span, dtype=bool)
    occupied[bins - lo] = True
    grid = np.flatnonzero(occupied)
    rank = np.cumsum(occupied, dtype=np.int64) - 1
    return grid + lo, rank[bins - lo]


@dataclass(frozen=True, slots=True)
class ArmSample:
    """One arm's values of one metric over a window's `units` time units of `unit_s` seconds.

    Entries (unit, bin, count) are a sparse histogram per unit on the fine grid (a compacted
    block's coarse bin enters at its centre fine bin); `unit_n`/`unit_sum` are exact. Entries may
    stand for `piece_units` units (an hour block entered at its first minute): bootstrap blocks
    then hold whole pieces and the block-length rule reads `series` (per-unit log mean).
    """

    units: int
    unit: IntArray
    bins: IntArray
    counts: IntArray
    unit_n: IntArray = field(repr=False)
    unit_sum: FloatArray = field(repr=False)
    unit_s: float = 60.0
    piece_units: int = 1
    series: FloatArray | None = field(default=None, repr=False)
    grid_error: float = GRID_ERROR_BOUND
    _pooled: list[tuple[IntArray, IntArray, IntArray]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @classmethod
    def from_values(
        cls, values: FloatArray, unit: IntArray, units: int, unit_s: float = 60.0
    ) -> ArmSample:
        """Rows as the form: each strictly positive value binned as the store's writer bins it;
        `unit[i]` is value i's time unit in 0..units-1."""
        u = np.asarray(unit, dtype=np.int64)
        v = np.asarray(values, dtype=np.float64)
        if u.shape != v.shape:
            raise ValueError("unit and values must have the same shape")
        if u.size and (int(u.min()) < 0 or int(u.max()) >= units):
            raise ValueError("unit ids must lie in 0..units-1")
        b = bin_index(v)
        lo = int(b.min()) if b.size else 0
        span = int(b.max()) - lo + 1 if b.size else 1
        key, counts = np.unique(u * span + (b - lo), return_counts=True)
        return cls(
            units=units,
            unit=key // span,
            bins=key % span + lo,
            counts=counts.astype(np.int64),
            unit_n=np.bincount(u, minlength=units).astype(np.int64),
            unit_sum=np.bincount(u, weights=v, minlength=units).astype(np.float64),
            unit_s=unit_s,
        )

    @classmethod
    def empty(cls, units: int = 0, unit_s: float = 60.0) -> ArmSample:
        nothing = np.zeros(0, dtype=np.int64)
        return cls(
            units,
            nothing,
            nothing,
            nothing,
            np.zeros(units, dtype=np.int64),
            np.zeros(units),
            unit_s=unit_s,
        )

    @classmethod
    def merged(cls, parts: Sequence[ArmSample]) -> ArmSample:
        """The sample of the values of every part: parts of one window (the same units, unit
        length, pieces and grid), such as a band's condition keys (`stats.segments`)."""
        if not parts:
            raise ValueError("nothing to merge")
        first = parts[0]
        if len(parts) == 1:
            return first
        unit_n = np.sum([p.unit_n for p in parts], axis=0).astype(np.int64)
        unit_sum = np.sum([p.unit_sum for p in parts], axis=0).astype(np.float64)
        series = None
        if first.series is not None:  # per-unit log mean, as the window's own (`frame`)
            with np.errstate(invalid="ignore", divide="ignore"):
                series = np.where(unit_n > 0, np.log(unit_sum / np.maximum(unit_n, 1)), np.nan)
        return cls(
            units=first.units,
            unit=np.concatenate([p.unit for p in parts]),
            bins=np.concatenate([p.bins for p in parts]),
            counts=np.concatenate([p.counts for p in parts]),
            unit_n=unit_n,
            unit_sum=unit_sum,
            unit_s=first.unit_s,
            piece_units=first.piece_units,
            series=series,
            grid_error=max(p.grid_error for p in parts),
        )

    @property
    def n(self) -> int:
        return int(self.unit_n.sum())

    def pooled(self) -> tuple[IntArray, IntArray]:
        """(sorted bins, counts) of the whole window, computed once (do not modify)."""
        if not self._pooled:
            self.cache_pooled(*unique_inverse(self.bins))
        bins, counts, _cum = self._pooled[0]
        return bins, counts

    def cache_pooled(self, grid: IntArray, inverse: IntArray) -> None:
        """Set `pooled()` from the entries' sorted unique bins and each entry's position in them,
        when a caller computed those anyway (the block bootstrap does)."""
        if not self._pooled:
            counts = np.rint(np.bincount(inverse, weights=self.counts, minlength=grid.size))
            counts = counts.astype(np.int64)
            self._pooled.append((grid, counts, np.cumsum(counts)))

    def order_statistic(self, k: int) -> float:
        """The k-th smallest value (1-based, clipped to 1..n), as its bin's centre."""
        bins, _counts = self.pooled()
        cum = self._pooled[0][2]
        at = min(int(np.searchsorted(cum, k, side="left")), bins.size - 1)
        return float(np.exp((bins[at] + 0.5) * GRID_LOG_WIDTH))

    def quantile(self, p: float) -> float:
        """numpy's default (linear) quantile of the values, each at its bin's centre."""
        n = self.n
        if n == 0:
            return math.nan
        h = (n - 1) * p
        j = math.floor(h)
        low = self.order_statistic(j + 1)
        if h == j or j + 2 > n:
            return low
        return low + (h - j) * (self.order_statistic(j + 2) - low)

    def mean(self) -> float:
        """Exact, from the per-unit sums."""
        return float(self.unit_sum.sum() / self.n) if self.n else math.nan

    def statistic(self, name: str) -> float:
        """A named statistic: "mean" or a key of `QUANTILE_LEVELS`."""
        return self.mean() if name == "mean" else self.quantile(QUANTILE_LEVELS[name])

    def unit_influence(self, statistic: str) -> FloatArray:
        """Per unit, the statistic's (unscaled) influence summed over its values, zero where
        empty and summing to zero: for a quantile the unit's count above the pooled quantile's
        bin minus its share of all such counts, for the mean the unit's sum minus mean x count.
        Entries of a piece sit at its first unit: only sums over whole pieces mean anything."""
        n = self.n
        if n == 0:
            return np.zeros(self.units)
        if statistic == "mean":
            out: FloatArray = self.unit_sum - (self.unit_sum.sum() / n) * self.unit_n
            # rounding of the sums is not dependence: zero below it (equal values, any source)
            out[np.abs(out) <= 1e-9 * np.abs(self.unit_sum)] = 0.0
            return out
        bins, _counts = self.pooled()
        cum = self._pooled[0][2]
        rank = math.floor((n - 1) * QUANTILE_LEVELS[statistic])
        q_bin = bins[int(np.searchsorted(cum, rank, side="right"))]
        above = np.bincount(
            self.unit, weights=np.where(self.bins > q_bin, self.counts, 0), minlength=self.units
        ).astype(np.float64)
        influence: FloatArray = above - (above.sum() / n) * self.unit_n
        return influence

    def unit_log_means(self) -> FloatArray:
        """Mean log value per unit (NaN where empty): the block-length rule's series."""
        if self.series is not None:
            return self.series
        sums = np.bincount(
            self.unit, weights=self.counts * bin_log_centres(self.bins), minlength=self.units
        )
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.unit_n > 0, sums / np.maximum(self.unit_n, 1), np.nan)


@dataclass(frozen=True, slots=True)
class ArmWindow:
    """One arm of one window: a sample per summarised metric (`summary.minute.ROLLUP_METRICS`),
    the length adjustment's `MOMENT_SUMS` per unit of the e2e sample (None: not stored for
    it), and how many usable requests warm-up left out."""

    samples: Mapping[str, ArmSample]
    moments: FloatArray | None = None
    excluded_warmup: int = 0

    @property
    def requests(self) -> int:
        return self.samples["e2e"].n if "e2e" in self.samples else 0

    def sample(self, metric: str) -> ArmSample:
        found = self.samples.get(metric)
        return found if found is not None else ArmSample.empty()


@dataclass(frozen=True, slots=True)
class Pairs:
    """Mirrored pairs of a window: per metric, both arms' values of the same requests (pair i of
    each array) and the time unit of each pair, in the window's units."""

    control: Mapping[str, FloatArray]
    treatment: Mapping[str, FloatArray]
    unit: Mapping[str, IntArray]
    units: int
    unit_s: float

    @property
    def count(self) -> int:
        """Complete pairs of the e2e metric (the design rule compares it with the arms' n)."""
        return int(self.control["e2e"].size) if "e2e" in self.control else 0

    def samples(self, metric: str) -> tuple[ArmSample, ArmSample]:
        """Both arms' pair members as samples sharing each pair's unit (so the block bootstrap
        keeps pairs together)."""
        unit = self.unit[metric]
        return (
            ArmSample.from_values(self.control[metric], unit, self.units, self.unit_s),
            ArmSample.from_values(self.treatment[metric], unit, self.units, self.unit_s),
        )
