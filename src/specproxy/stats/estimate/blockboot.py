"""Speedup intervals from two `ArmSample`s: a Poisson time-block bootstrap beside an i.i.d. one.

Latency is serially correlated (load waves, batch mix), so requests are not independent: whole
time blocks are resampled (Kunsch 1989; block length in `blocklength`, from the mean log series
and each statistic's own influence series), one Poisson(1) weight per block shared by both arms.
Quantile replicates are order statistics of the reweighted histograms (within the grid bound),
mean replicates use the exact block sums; a percentile interval over k blocks is widened by
sqrt(k/(k-1)) t_df / z, df from the blocks' influence (docs/statistics.md). The i.i.d. interval
is kept beside it and reported with fewer than `MIN_BLOCKS` blocks; a material difference
between the two is explained in words, stating only what was measured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as scipy_stats

from specproxy.stats.estimate.blocklength import MIN_BLOCKS, BlockPlan, plan_blocks
from specproxy.stats.estimate.bootstrap import DEFAULT_RESAMPLES, Interval, percentile_interval
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS
from specproxy.stats.sample import ArmSample, unique_inverse
from specproxy.summary.histogram import bin_centres

__all__ = [
    "MATERIAL_WIDTH_RATIO",
    "MAX_BLOCKS",
    "MEASURED_CORRELATION",
    "BlockBootstrapResult",
    "BlockInterval",
    "block_speedup_intervals",
    "unit_correlation",
    "value_speedup_intervals",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

MATERIAL_WIDTH_RATIO: Final = 1.25  # block vs i.i.d. log-width ratio that we call material
# Correlation of the arms' per-unit log means from which a note names it as the reason a block
# interval is narrower than the i.i.d. one.
MEASURED_CORRELATION: Final = 0.3
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
class BlockInterval:
    """Block and i.i.d. intervals of one speedup statistic, and which one is reported."""

    block: Interval
    iid: Interval
    reported: Literal["block", "iid"]
    differs: bool  # log-width ratio outside [1/MATERIAL_WIDTH_RATIO, MATERIAL_WIDTH_RATIO]
    width_ratio: float  # block log-width / i.i.d. log-width
    reason: str | None  # why the intervals differ / why the reported one was chosen
    # the small-sample expansion of the block interval's log half-widths (1: none) and the
    # degrees of freedom it used (NaN: not computed)
    expansion: float = 1.0
    df: float = math.nan

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


def _regroup(arm: ArmSample, block_units: int, blocks: int) -> _Blocked:
    block = arm.unit // block_units
    grid, pos = unique_inverse(arm.bins)
    arm.cache_pooled(grid, pos)
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
    arm: ArmSample, statistics: Sequence[str], rng: np.random.Generator, resamples: int
) -> dict[str, FloatArray]:
    """i.i.d. replicates read off the pooled histogram: quantiles by exact order-statistic
    resampling (within half a bin of resampling the values); the mean by a Poisson bootstrap
    over 1 % bins (its normal limit from `_NORMAL_MEAN_N` requests on)."""
    ub, c = arm.pooled()
    centres = bin_centres(ub)
    out: dict[str, FloatArray] = {}
    for stat in statistics:
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


def _block_sums(series: FloatArray, block_units: int, blocks: int) -> FloatArray:
    ub = np.arange(series.size) // block_units
    return np.bincount(ub, weights=series, minlength=blocks).astype(np.float64)


def _small_sample_expansion(
    influence: tuple[FloatArray, FloatArray],
    replicates: tuple[FloatArray, FloatArray],
    confidence: float,
) -> tuple[float, float]:
    """(factor, df): sqrt(k/(k-1)) t_df / z for k blocks, df the Satterthwaite degrees of freedom
    of the block variance sum_b U_b^2, U_b the block's influence on the log speedup (each arm's
    per-block influence sums scaled so their sum of squares is that arm's bootstrap variance of
    the log statistic). (1, NaN) with fewer than 3 blocks or no spread."""
    k = influence[0].size
    if k < 3:
        return 1.0, math.nan
    scaled = []
    for u, rep in zip(influence, replicates, strict=True):
        with np.errstate(invalid="ignore", divide="ignore"):
            logs = np.log(rep)
        logs = logs[np.isfinite(logs)]
        ss = float(u @ u)
        var = float(np.var(logs)) if logs.size > 1 else 0.0
        scaled.append(u * math.sqrt(var / ss) if ss > 0.0 else np.zeros(k))
    u2 = (scaled[0] - scaled[1]) ** 2
    if not float(u2.sum()) > 0.0:
        return 1.0, math.nan
    spread = float(np.var(u2, ddof=1))
    df = 2.0 * k * float(u2.mean()) ** 2 / spread if spread > 0.0 else float(k - 1)
    df = min(max(df, 2.0), float(k - 1))
    tail = 0.5 + confidence / 2.0
    factor = (
        math.sqrt(k / (k - 1))
        * float(scipy_stats.t.ppf(tail, df))
        / float(scipy_stats.norm.ppf(tail))
    )
    return factor, df


def _expanded(ratios: FloatArray, confidence: float, factor: float) -> tuple[float, float]:
    """The percentile bounds of `ratios`, their log distances from the replicates' median
    multiplied by `factor`."""
    lo, hi = percentile_interval(ratios, confidence)
    finite = ratios[np.isfinite(ratios) & (ratios > 0)]
    if factor == 1.0 or finite.size == 0 or not (lo > 0 and hi > 0):
        return lo, hi
    centre = float(np.median(finite))
    return centre * (lo / centre) ** factor, centre * (hi / centre) ** factor


def _log_width(interval: Interval) -> float:
    if interval.lower > 0 and math.isfinite(interval.upper) and interval.upper > 0:
        return math.log(interval.upper / interval.lower)
    return math.nan


def _choose(
    estimate: float,
    block: FloatArray,
    i: Interval,
    plan: BlockPlan,
    confidence: float,
    correlation: float | None,
    expansion: tuple[float, float] = (1.0, math.nan),
) -> BlockInterval:
    factor, df = expansion
    b = Interval(estimate, *_expanded(block, confidence, factor))
    wb, wi = _log_width(b), _log_width(i)
    ratio = wb / wi if wi > 0 and math.isfinite(wb) else math.nan
    differs = math.isfinite(ratio) and not (
        1.0 / MATERIAL_WIDTH_RATIO <= ratio <= MATERIAL_WIDTH_RATIO
    )
    blocks = f"{plan.blocks} blocks of {plan.block_units} time unit(s)"
    reason: str | None = None
    if not plan.reliable:
        reason = (
            f"only {plan.blocks} time blocks (< {MIN_BLOCKS}): too few to resample, so the i.i.d. "
            "interval is reported; it is too narrow if latency is serially correlated"
        )
        return BlockInterval(b, i, "iid", differs, ratio, reason, factor, df)
    if differs and ratio > 1:
        reason = (
            f"latency is serially correlated (Politis-White block length "
            f"{plan.politis_white:.1f} units): resampling {blocks} widens the interval "
            f"{ratio:.2f}x; the i.i.d. interval assumes independent requests and is too narrow"
        )
    elif differs:
        measured = (
            f"; the arms' per-unit mean log latencies correlate at r = {correlation:.2f}, and "
            "resampling both arms' units together keeps that shared part out of the ratio"
            if correlation is not None and correlation >= MEASURED_CORRELATION
            else ""
        )
        reason = (
            f"resampling {blocks}, one weight per block for both arms, gives an interval "
            f"{ratio:.2f}x as wide as the i.i.d. one{measured}"
        )
    return BlockInterval(b, i, "block", differs, ratio, reason, factor, df)


def unit_correlation(control: ArmSample, treatment: ArmSample) -> float | None:
    """Pearson correlation of the arms' per-unit mean log values over the units both hold
    (None below `MIN_BLOCKS` such units, or without variance): what a note may claim about
    shared load, measured rather than inferred from widths."""
    a, b = control.unit_log_means(), treatment.unit_log_means()
    both = np.isfinite(a) & np.isfinite(b)
    if int(both.sum()) < MIN_BLOCKS:
        return None
    x, y = a[both] - a[both].mean(), b[both] - b[both].mean()
    scale = math.sqrt(float(x @ x) * float(y @ y))
    return float(x @ y) / scale if scale > 0 else None


def block_speedup_intervals(
    control: ArmSample,
    treatment: ArmSample,
    *,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
    block_units: int | None = None,
    iid: dict[str, Interval] | None = None,
    expand: bool = True,
) -> BlockBootstrapResult:
    """Block and i.i.d. CIs of speedup = statistic(control) / statistic(treatment).

    Point speedups come from the samples. `block_units` overrides the Politis-White rule (tests,
    fixed designs); either way blocks are made longer when there would be more than
    `MAX_BLOCKS`, and rounded up to whole pieces (`ArmSample.piece_units`). `iid`: i.i.d.
    intervals the caller computed (the paired design's bootstrap over pairs), used as given.
    `expand`: the small-sample expansion of the block intervals (module docstring).
    """
    if control.units != treatment.units:
        raise ValueError("both arms must cover the same time units")
    units = control.units
    arms = (control, treatment)
    influence = {
        stat: (control.unit_influence(stat), treatment.unit_influence(stat)) for stat in statistics
    }
    # the block length asked for by the arms' mean log series and by each statistic's own
    # influence series (not for arms of pieces: their entries sit at each piece's first unit)
    series = [arm.unit_log_means() for arm in arms]
    series += [
        influence[stat][i]
        for stat in statistics
        for i, arm in enumerate(arms)
        if arm.piece_units == 1 and arm.series is None and arm.n > 0
    ]
    plan = plan_blocks(series, units)
    piece = max(control.piece_units, treatment.piece_units)
    chosen = block_units if block_units is not None else plan.block_units
    chosen = max(chosen, math.ceil(units / MAX_BLOCKS))
    chosen = math.ceil(chosen / piece) * piece
    if chosen != plan.block_units:
        blocks = math.ceil(units / chosen) if units else 0
        plan = BlockPlan(units, chosen, blocks, plan.politis_white, blocks >= MIN_BLOCKS)
    nan = Interval(math.nan, math.nan, math.nan)
    if control.n == 0 or treatment.n == 0:
        none = BlockInterval(nan, nan, "iid", False, math.nan, "an arm has no data")
        return BlockBootstrapResult(plan, {s: none for s in statistics})
    weights = rng.poisson(1.0, size=(resamples, plan.blocks)).astype(np.float64)
    c_block = _block_replicates(
        _regroup(control, plan.block_units, plan.blocks), statistics, weights
    )
    t_block = _block_replicates(
        _regroup(treatment, plan.block_units, plan.blocks), statistics, weights
    )
    if iid is None:
        c_iid = _iid_replicates(control, statistics, rng, resamples)
        t_iid = _iid_replicates(treatment, statistics, rng, resamples)
    correlation = unit_correlation(control, treatment)
    out: dict[str, BlockInterval] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for stat in statistics:
            est = control.statistic(stat) / treatment.statistic(stat)
            if iid is not None:
                given = iid[stat]
                iid_interval = Interval(est, given.lower, given.upper)
            else:
                lo, hi = percentile_interval(c_iid[stat] / t_iid[stat], confidence)
                iid_interval = Interval(est, lo, hi)
            ratios = c_block[stat] / t_block[stat]
            expansion = (1.0, math.nan)
            if expand:
                c_u, t_u = (_block_sums(u, plan.block_units, plan.blocks) for u in influence[stat])
                expansion = _small_sample_expansion(
                    (c_u, t_u), (c_block[stat], t_block[stat]), confidence
                )
            out[stat] = _choose(est, ratios, iid_interval, plan, confidence, correlation, expansion)
    return BlockBootstrapResult(plan, out)


def value_speedup_intervals(
    control: FloatArray,
    treatment: FloatArray,
    *,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
) -> dict[str, Interval]:
    """The same estimator for callers holding bare values without times (the offline bench, the
    simulations): one time unit, so the i.i.d. interval off the histograms."""
    samples = []
    for values in (control, treatment):
        v = np.asarray(values, dtype=np.float64)
        v = v[np.isfinite(v) & (v > 0)]
        samples.append(ArmSample.from_values(v, np.zeros(v.size, dtype=np.int64), 1))
    result = block_speedup_intervals(
        samples[0],
        samples[1],
        statistics=statistics,
        rng=rng,
        resamples=resamples,
        confidence=confidence,
    )
    return {stat: found.interval for stat, found in result.intervals.items()}
