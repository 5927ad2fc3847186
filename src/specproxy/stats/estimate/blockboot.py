"""Time-block Poisson bootstrap of speedup ratios over per-unit (per-minute) fine histograms.

Why: latency in production is serially correlated (load waves, batch composition, neighbours),
so an i.i.d. bootstrap over requests is too narrow (notes/ab_stats.md: coverage 0.75-0.80 on a
loaded host). Resampling whole time blocks keeps the dependence inside a block (Kunsch 1989;
Politis & White 2004 for the block length, see `blocklength.py`).

Method:
  * Data of each arm are time units (minutes from rollups; any unit from raw rows) each holding a
    histogram on the fixed grid of `loggrid.py`, plus the unit's exact count and sum.
  * Units are grouped into consecutive blocks of B units (`blocklength.plan_blocks`).
  * A replicate gives every block one Poisson(1) weight, the SAME weight in both arms: with
    traffic split at random within a minute, both arms see the same minute's load, and with
    mirrored traffic both members of a pair lie in the same unit, so pairing is kept inside blocks.
  * A quantile replicate is the lower order statistic at rank floor((T-1) p) of the reweighted
    summed histogram (T its total), reported as its bin's geometric centre: within exp(+-d/2) of
    the exact weighted order statistic, a ratio within `GRID_ERROR_BOUND` (0.02 %).
  * A mean replicate is sum_b w_b S_b / sum_b w_b N_b from the blocks' exact sums: no binning.
  * Cost: O(R x blocks x (G + J/G)) per quantile with J occupied bins and G ~ sqrt(J) groups
    (a coarse pass locates each replicate's quantile group, a fine pass the bin), independent of
    the number of requests.

The i.i.d. interval is computed on the same histograms by exact order-statistic resampling read
off the cumulative counts (the mean: a Poisson bootstrap over 1 % bins); both are returned, and
when they differ materially (log-width ratio outside [1/1.25, 1.25]) the result says which is
used and why.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from specproxy.stats.estimate.blocklength import MIN_BLOCKS, BlockPlan, plan_blocks
from specproxy.stats.estimate.bootstrap import (
    DEFAULT_RESAMPLES,
    Interval,
    percentile_interval,
    split_replicates,
)
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS
from specproxy.summary.histogram import bin_centres, bin_index, bin_log_centres

__all__ = [
    "MATERIAL_WIDTH_RATIO",
    "MAX_BLOCKS",
    "ArmBlocks",
    "BlockBootstrapResult",
    "BlockInterval",
    "block_speedup_intervals",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MATERIAL_WIDTH_RATIO: Final = 1.25  # block vs i.i.d. log-width ratio that we call material
# Most blocks one replicate weighs (cost and memory ~ resamples x blocks): beyond it blocks are
# made longer, which only keeps more of the dependence (conservative). A 30-day window of hour
# blocks has 720.
MAX_BLOCKS: Final = 1000
_MEAN_COARSEN: Final = 50  # 50 grid bins = 1 % wide: the i.i.d. mean's bins (as bootstrap.py)
# From this many requests on, the i.i.d. mean's Poisson bootstrap over bins is replaced by its
# normal limit (mean + sd z, sd^2 = sum_j c_j (m_j - mean)^2 / n^2, the delta method applied to
# sum_j w_j m_j / sum_j w_j), whose error is O(1/n): R draws instead of R x bins (rollup windows
# of 1e9 requests spend ~0.1 s per arm on the Poisson matrix otherwise).
_NORMAL_MEAN_N: Final = 100_000


@dataclass(frozen=True, slots=True)
class ArmBlocks:
    """One arm's data as sparse (unit, bin, count) triplets plus exact per-unit count and sum."""

    units: int  # number of time units in the window, unit ids are 0..units-1
    unit: IntArray  # per entry
    bins: IntArray  # per entry, grid bin
    counts: IntArray  # per entry, > 0
    unit_n: IntArray = field(repr=False)  # per unit
    unit_sum: FloatArray = field(repr=False)  # per unit, exact sum of values
    # Entries may stand for several units (an hour block of the compacted rollup tier is entered
    # at its first minute): then every bootstrap block must hold whole pieces of `piece_units`
    # units (units are counted from a piece boundary), and the block-length rule reads `series`
    # (per unit, NaN when empty) instead of the per-unit mean log from the bins.
    piece_units: int = 1
    series: FloatArray | None = field(default=None, repr=False)
    # `pooled()` once per instance (the statistics, the i.i.d. replicates and the tests read it)
    _pooled: list[tuple[IntArray, IntArray]] = field(
        default_factory=list, init=False, repr=False, compare=False
    )

    @classmethod
    def from_values(cls, unit: npt.NDArray[np.int64], values: FloatArray, units: int) -> ArmBlocks:
        """Bin raw values; `unit` is each value's time unit in 0..units-1."""
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
        )

    @property
    def n(self) -> int:
        return int(self.unit_n.sum())

    def unit_log_means(self) -> FloatArray:
        """Mean log latency per unit from the bins (NaN for empty units): the block rule's input
        (`series` when given)."""
        if self.series is not None:
            return self.series
        logs = bin_log_centres(self.bins)
        s = np.bincount(self.unit, weights=self.counts * logs, minlength=self.units)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.unit_n > 0, s / np.maximum(self.unit_n, 1), np.nan)

    def pooled(self) -> tuple[IntArray, IntArray]:
        """(bins, counts) of the whole window (computed once; do not modify the arrays)."""
        if not self._pooled:
            self._pool(*_unique_inverse(self.bins))
        return self._pooled[0]

    def _pool(self, grid: IntArray, inverse: IntArray) -> None:
        """Cache `pooled()` from the entries' sorted unique bins and each entry's position in
        them (`_regroup` computes those anyway: one pass over the entries instead of two)."""
        counts = np.bincount(inverse, weights=self.counts, minlength=grid.size)
        self._pooled.append((grid, np.rint(counts).astype(np.int64)))

    def point_statistic(self, statistic: str) -> float:
        """The statistic from the histogram (quantiles within exp(+-d/2)); the mean is exact."""
        if self.n == 0:
            return math.nan
        if statistic == "mean":
            return float(self.unit_sum.sum() / self.n)
        ub, c = self.pooled()
        rank = math.floor((self.n - 1) * QUANTILE_LEVELS[statistic])
        return float(bin_centres(ub[np.searchsorted(np.cumsum(c), rank, side="right")]))


@dataclass(frozen=True, slots=True)
class BlockInterval:
    """Block and i.i.d. intervals of one speedup statistic, and which one is reported."""

    block: Interval
    iid: Interval
    reported: Literal["block", "iid"]
    differs: bool  # log-width ratio outside [1/MATERIAL_WIDTH_RATIO, MATERIAL_WIDTH_RATIO]
    width_ratio: float  # block log-width / i.i.d. log-width
    reason: str | None  # why the intervals differ / why the reported one was chosen

    @property
    def interval(self) -> Interval:
        return self.block if self.reported == "block" else self.iid

    def to_dict(self) -> dict[str, object]:
        return {
            **self.interval.to_dict(),
            "method": self.reported,
            "block": self.block.to_dict(),
            "iid": self.iid.to_dict(),
            "differs": self.differs,
            "width_ratio": self.width_ratio if math.isfinite(self.width_ratio) else None,
            "reason": self.reason,
        }


@dataclass(frozen=True, slots=True)
class BlockBootstrapResult:
    plan: BlockPlan
    intervals: dict[str, BlockInterval]

    def to_dict(self) -> dict[str, object]:
        return {
            "blocks": self.plan.to_dict(),
            "speedup": {k: v.to_dict() for k, v in self.intervals.items()},
        }


@dataclass(frozen=True, slots=True)
class _Blocked:
    """An arm regrouped into blocks: entries sorted by bin with their block ids."""

    blocks: int
    block: IntArray
    bin_pos: IntArray  # position of each entry's bin in `grid`
    counts: FloatArray
    grid: IntArray  # sorted unique bins
    block_n: FloatArray
    block_sum: FloatArray


def _unique_inverse(bins: IntArray) -> tuple[IntArray, IntArray]:
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


def _regroup(arm: ArmBlocks, block_units: int, blocks: int) -> _Blocked:
    block = arm.unit // block_units
    grid, pos = _unique_inverse(arm.bins)
    if not arm._pooled:
        arm._pool(grid, pos)
    ub = np.arange(arm.units) // block_units
    return _Blocked(
        blocks=blocks,
        block=block,
        bin_pos=pos.astype(np.int64),
        counts=arm.counts.astype(np.float64),
        grid=grid,
        block_n=np.bincount(ub, weights=arm.unit_n, minlength=blocks).astype(np.float64),
        block_sum=np.bincount(ub, weights=arm.unit_sum, minlength=blocks).astype(np.float64),
    )


# Largest blocks x bins count kept as one dense matrix by `_BlockQuantiles` (8 bytes each): a
# 30-day window of hour blocks on the 0.5 % grid is 720 x ~1200; above it, masks per group.
_DENSE_CELLS: Final = 4_000_000


class _BlockQuantiles:
    """Replicates of block-reweighted quantiles of one arm, sharing the work every quantile needs.

    A replicate's quantile is the lower order statistic at rank floor((T-1)p) of its reweighted
    summed histogram. A coarse pass over groups of ~sqrt(J) consecutive bins (the cumulative
    count before each group, one matrix product for all quantiles) finds the group holding each
    replicate's rank, a fine pass over that group's bins the bin."""

    def __init__(self, data: _Blocked, weights: FloatArray) -> None:
        self.data = data
        self.weights = weights
        j_total = data.grid.size
        self.totals = weights @ data.block_n
        groups = max(1, min(j_total, math.ceil(math.sqrt(j_total))))
        self.starts = np.unique(np.linspace(0, j_total, groups + 1).astype(np.int64))
        self.groups = self.starts.size - 1
        self.dense: FloatArray | None = None
        if data.blocks * j_total <= _DENSE_CELLS:
            dense = np.asarray(
                np.bincount(
                    data.block * j_total + data.bin_pos,
                    weights=data.counts,
                    minlength=data.blocks * j_total,
                ),
                dtype=np.float64,
            ).reshape(data.blocks, j_total)
            self.dense = dense
            per_group = np.add.reduceat(dense, self.starts[:-1], axis=1)
        else:
            group_of_bin = np.searchsorted(self.starts, np.arange(j_total), side="right") - 1
            per_group = np.bincount(
                data.block * self.groups + group_of_bin[data.bin_pos],
                weights=data.counts,
                minlength=data.blocks * self.groups,
            ).reshape(data.blocks, self.groups)
        before = np.concatenate([np.zeros((data.blocks, 1)), np.cumsum(per_group, axis=1)], axis=1)
        self.cum_before = weights @ before  # (R, groups + 1); last column = totals

    def _group_counts(self, lo: int, hi: int) -> FloatArray:
        """(blocks, hi - lo) counts of bins lo..hi-1."""
        if self.dense is not None:
            return self.dense[:, lo:hi]
        data = self.data
        sel = (data.bin_pos >= lo) & (data.bin_pos < hi)
        width = hi - lo
        flat = np.bincount(
            data.block[sel] * width + (data.bin_pos[sel] - lo),
            weights=data.counts[sel],
            minlength=data.blocks * width,
        )
        return np.asarray(flat, dtype=np.float64).reshape(data.blocks, width)

    def quantile(self, p: float) -> FloatArray:
        out = np.full(self.weights.shape[0], np.nan)
        if self.data.grid.size == 0:
            return out
        rank = np.floor((self.totals - 1.0) * p)
        group = (self.cum_before[:, 1:] <= rank[:, None]).sum(axis=1)
        ok = (self.totals > 0) & (group < self.groups)
        for g in np.unique(group[ok]):
            rows = np.flatnonzero(ok & (group == g))
            lo, hi = int(self.starts[g]), int(self.starts[g + 1])
            counts = self._group_counts(lo, hi)
            fine = self.cum_before[rows, g][:, None] + np.cumsum(
                self.weights[rows] @ counts, axis=1
            )
            idx = np.minimum((fine <= rank[rows, None]).sum(axis=1), hi - lo - 1)
            out[rows] = bin_centres(self.data.grid[lo + idx])
        return out


def _block_replicates(
    data: _Blocked, statistics: Sequence[str], weights: FloatArray
) -> dict[str, FloatArray]:
    out: dict[str, FloatArray] = {}
    quantiles: _BlockQuantiles | None = None
    for stat in statistics:
        if stat == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                out[stat] = (weights @ data.block_sum) / (weights @ data.block_n)
        else:
            quantiles = quantiles or _BlockQuantiles(data, weights)
            out[stat] = quantiles.quantile(QUANTILE_LEVELS[stat])
    return out


def _iid_replicates(
    arm: ArmBlocks,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int,
    raw: FloatArray | None,
) -> dict[str, FloatArray]:
    """i.i.d. replicates: exact order-statistic resampling of raw values when given (what
    `bootstrap.split_replicates` does), else the same resampling read off the pooled grid
    histogram (within half a bin); the mean uses a Poisson bootstrap over 1 % bins (its normal
    limit from `_NORMAL_MEAN_N` requests on)."""
    ub, c = arm.pooled()
    centres = bin_centres(ub)
    out: dict[str, FloatArray] = {}
    quantiles = [s for s in statistics if s != "mean"]
    if raw is not None and quantiles:
        out.update(split_replicates(raw, quantiles, rng, resamples))
    for stat in statistics:
        if stat in out:
            continue
        if stat == "mean":
            coarse, j = np.unique(np.floor_divide(ub, _MEAN_COARSEN), return_inverse=True)
            cc = np.bincount(j, weights=c)
            means = np.bincount(j, weights=c * centres) / cc
            n = float(cc.sum())
            if n >= _NORMAL_MEAN_N:
                # the Poisson replicate's normal limit, drawn directly: R draws, not R x bins
                mean = float(cc @ means) / n
                sd = math.sqrt(float(cc @ (means - mean) ** 2)) / n
                out[stat] = mean + sd * rng.standard_normal(resamples)
                continue
            w = rng.poisson(cc, size=(resamples, coarse.size))
            with np.errstate(invalid="ignore", divide="ignore"):
                out[stat] = (w @ means) / w.sum(axis=1)
        else:
            out[stat] = _order_stat_bins(centres, c, QUANTILE_LEVELS[stat], rng, resamples)
    return out


def _order_stat_bins(
    centres: FloatArray, counts: IntArray, p: float, rng: np.random.Generator, resamples: int
) -> FloatArray:
    """i.i.d. bootstrap replicates of the lower order statistic at rank floor((n-1)p) from a
    histogram, drawn exactly: that order statistic of a resample is the value at rank
    ceil(n U) with U ~ Beta(k, n-k+1) (as `bootstrap._order_stat_quantile`), here read off the
    cumulative counts, so the cost is O(resamples log bins) whatever n is."""
    n = int(counts.sum())
    k = math.floor((n - 1) * p) + 1
    u = rng.beta(k, n - k + 1, size=resamples)
    rank = np.clip(np.ceil(n * u).astype(np.int64), 1, n)
    return centres[np.searchsorted(np.cumsum(counts), rank, side="left")]


def _log_width(interval: Interval) -> float:
    if interval.lower > 0 and math.isfinite(interval.upper) and interval.upper > 0:
        return math.log(interval.upper / interval.lower)
    return math.nan


def _choose(
    estimate: float, block: FloatArray, i: Interval, plan: BlockPlan, confidence: float
) -> BlockInterval:
    b = Interval(estimate, *percentile_interval(block, confidence))
    wb, wi = _log_width(b), _log_width(i)
    ratio = wb / wi if wi > 0 and math.isfinite(wb) else math.nan
    differs = math.isfinite(ratio) and not (
        1.0 / MATERIAL_WIDTH_RATIO <= ratio <= MATERIAL_WIDTH_RATIO
    )
    unit_words = f"blocks of {plan.block_units} time unit(s), {plan.blocks} blocks"
    reason: str | None = None
    if not plan.reliable:
        reason = (
            f"only {plan.blocks} time blocks (< {MIN_BLOCKS}): too few to resample, so the i.i.d. "
            "interval is reported; it is too narrow if latency is serially correlated"
        )
        return BlockInterval(b, i, "iid", differs, ratio, reason)
    if differs and ratio > 1:
        reason = (
            f"latency is serially correlated (Politis-White block length "
            f"{plan.politis_white:.1f} units): resampling {unit_words} widens the interval "
            f"{ratio:.2f}x; the i.i.d. interval assumes independent requests and is too narrow"
        )
    elif differs:
        reason = (
            f"both arms share each time unit's load, and resampling {unit_words} jointly "
            f"cancels it: the block interval is {ratio:.2f}x as wide as the i.i.d. one, "
            "which treats the arms as independent"
        )
    return BlockInterval(b, i, "block", differs, ratio, reason)


def block_speedup_intervals(
    baseline: ArmBlocks,
    speculative: ArmBlocks,
    *,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    estimates: dict[str, float] | None = None,
    block_units: int | None = None,
    raw: tuple[FloatArray, FloatArray] | None = None,
    iid: dict[str, Interval] | None = None,
) -> BlockBootstrapResult:
    """Block and i.i.d. CIs of speedup = statistic(baseline) / statistic(speculative).

    `estimates` are point speedups from raw values when available (else from the histograms);
    `block_units` overrides the Politis-White rule (tests, fixed designs); either way blocks are
    made longer when there would be more than `MAX_BLOCKS`, and rounded up to whole pieces
    (`ArmBlocks.piece_units`); `raw` (baseline,
    speculative values, when the window is small enough to hold them) makes the i.i.d. quantile
    replicates exact instead of binned; `iid` passes i.i.d. intervals already computed by the
    caller (e.g. the paired engine of `bootstrap.py`), which are then used as they are.
    """
    if baseline.units != speculative.units:
        raise ValueError("both arms must cover the same time units")
    units = baseline.units
    plan = plan_blocks([baseline.unit_log_means(), speculative.unit_log_means()], units)
    piece = max(baseline.piece_units, speculative.piece_units)
    chosen = block_units if block_units is not None else plan.block_units
    chosen = max(chosen, math.ceil(units / MAX_BLOCKS))
    chosen = math.ceil(chosen / piece) * piece
    if chosen != plan.block_units:
        blocks = math.ceil(units / chosen) if units else 0
        plan = BlockPlan(units, chosen, blocks, plan.politis_white, blocks >= MIN_BLOCKS)
    nan = Interval(math.nan, math.nan, math.nan)
    if baseline.n == 0 or speculative.n == 0:
        none = BlockInterval(nan, nan, "iid", False, math.nan, "an arm has no data")
        return BlockBootstrapResult(plan, {s: none for s in statistics})
    weights = rng.poisson(1.0, size=(resamples, plan.blocks)).astype(np.float64)
    b_data = _regroup(baseline, plan.block_units, plan.blocks)
    s_data = _regroup(speculative, plan.block_units, plan.blocks)
    b_block = _block_replicates(b_data, statistics, weights)
    s_block = _block_replicates(s_data, statistics, weights)
    if iid is None:
        b_raw, s_raw = raw if raw is not None else (None, None)
        b_iid = _iid_replicates(baseline, statistics, rng, resamples, b_raw)
        s_iid = _iid_replicates(speculative, statistics, rng, resamples, s_raw)
    out: dict[str, BlockInterval] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for stat in statistics:
            est = (estimates or {}).get(stat)
            if est is None:
                est = baseline.point_statistic(stat) / speculative.point_statistic(stat)
            if iid is not None:
                given = iid[stat]
                iid_interval = Interval(est, given.lower, given.upper)
            else:
                lo, hi = percentile_interval(b_iid[stat] / s_iid[stat], confidence)
                iid_interval = Interval(est, lo, hi)
            out[stat] = _choose(est, b_block[stat] / s_block[stat], iid_interval, plan, confidence)
    return BlockBootstrapResult(plan, out)
