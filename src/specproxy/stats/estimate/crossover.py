"""The load at which speculation stops paying off: log(speedup) against load, with a block CI.

Each request carries the load it met (its arm's calls in flight at its engine when it was sent,
itself included: `RequestRecord.endpoint_in_flight`). An arm's window is cells of one load and one
time unit, each with its requests and the sum of their log latencies (`LoadSample`): a request
each from rows, or a load key's sample per unit from the summaries (`summary.conditions`), whose
values stand at their bins' centres. Loads are grouped from the lowest up until
each group holds at least `min_group` requests on both arms; a group's log speedup is the
difference of the arms' mean log latency (control minus treatment: > 0 where the treatment is
faster), placed at the group's mean load. Speculation's speedup falls with load (the verification
pass stops being free once the batch leaves the memory-bound regime), so the group values are
fitted by a decreasing isotonic regression (pool adjacent violators, weighted by requests), and
the crossover is where that fit, linearly interpolated between the groups' loads, reaches 0.

The interval resamples whole blocks of time units within each load group (a Poisson weight per
block and group, as `estimate.blockboot` weights blocks), both arms with the same weights, so a
burst that slowed both arms at once is resampled as one, and every load group stays in every
replicate (the fit is conditional on the loads observed: a group that a replicate dropped would
move the crossing for want of data, not for what the data say). Each group's replicate log
speedups are spread out around its estimate by the small-sample expansion of its k blocks,
sqrt(k / (k - 1)) t_(k-1) / z, as `blockboot` widens a block interval: with a few blocks a level
(three passes over each load in the emulator study) the plain percentile interval held the truth
in 26 of 30 runs. A replicate without a crossing
lies beyond the observed range: +inf when its fit stays above 0 (speculation helps at every load
seen), -inf when it never rises above 0. A bound at infinity is reported as None ("beyond the
observed range"). Binned values move each arm's mean log of a group by at most half a bin
(`binned_log_error`; 0.25 % on the coarse grid), so a group's log speedup by at most twice that,
2e: the lower bound is then read off the replicates' crossings of +2e (where the fit of exact
values could already reach 0), the upper off their crossings of -2e, so the interval holds
whatever the binning moved (a fit shifted by a constant is the shifted fit). A summary key
gathering several loads stands at their middle: each bound moves out by half its width.

Pure numpy; the statistics' rationale and the emulator study: docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt
from scipy import stats as scipy_stats

from specproxy.stats.estimate.blocklength import plan_blocks
from specproxy.stats.result import CrossoverResult
from specproxy.stats.sample import ArmSample
from specproxy.summary.histogram import bin_log_centres

__all__ = [
    "MIN_GROUP",
    "Crossover",
    "LoadSample",
    "binned_log_error",
    "crossover",
    "decreasing_fit",
    "first_crossing",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

MIN_GROUP: Final = 30  # requests per arm a load group needs
CrossoverStatus = Literal["ok", "helps_throughout", "costs_throughout", "too_little_data"]


@dataclass(frozen=True, slots=True)
class LoadSample:
    """One arm's requests of a window as cells, each of one load and one time unit (0..units-1):
    its requests and the sum of their log latencies. A request is a cell of its own (`of`); a
    window's summaries give a cell per load key and unit (`of_sample`)."""

    load: FloatArray
    unit: IntArray
    n: FloatArray
    log_sum: FloatArray

    @classmethod
    def of(cls, load: FloatArray, unit: IntArray, value: FloatArray) -> LoadSample:
        """One cell per request with a known load >= 1 and a finite positive latency."""
        load = np.asarray(load, dtype=np.float64)
        value = np.asarray(value, dtype=np.float64)
        ok = np.isfinite(load) & (load >= 1) & np.isfinite(value) & (value > 0)
        return cls(
            load[ok],
            np.asarray(unit, dtype=np.int64)[ok],
            np.ones(int(ok.sum())),
            np.log(value[ok]),
        )

    @classmethod
    def of_sample(cls, load: float, sample: ArmSample) -> LoadSample:
        """Cells of one load's sample: its entries per unit, each value at its bin's centre
        (within `binned_log_error` of its log)."""
        if sample.n == 0 or load < 1:
            return cls.joined([])
        n: FloatArray = np.bincount(
            sample.unit, weights=sample.counts, minlength=sample.units
        ).astype(np.float64)
        log_sum = np.bincount(
            sample.unit,
            weights=sample.counts * bin_log_centres(sample.bins),
            minlength=sample.units,
        ).astype(np.float64)
        at = np.flatnonzero(n > 0)
        return cls(np.full(at.size, float(load)), at.astype(np.int64), n[at], log_sum[at])

    @classmethod
    def joined(cls, parts: Iterable[LoadSample]) -> LoadSample:
        """The cells of every part."""
        every = list(parts)
        if not every:
            empty = np.zeros(0)
            return cls(empty, np.zeros(0, dtype=np.int64), empty, empty)
        return cls(
            np.concatenate([p.load for p in every]),
            np.concatenate([p.unit for p in every]),
            np.concatenate([p.n for p in every]),
            np.concatenate([p.log_sum for p in every]),
        )

    def in_pieces(self, piece_units: int) -> LoadSample:
        """The cells of pieces of `piece_units` units (an hour block's entries sit at its first
        unit: only whole pieces are resampled)."""
        if piece_units == 1:
            return self
        return LoadSample(self.load, self.unit // piece_units, self.n, self.log_sum)


def binned_log_error(sample: ArmSample) -> float:
    """How far a value's log may lie from its bin centre's: half a bin of the sample's grid."""
    return math.log1p(sample.grid_error) / 2.0


@dataclass(frozen=True, slots=True)
class Crossover:
    """Where the fitted speedup crosses 1 (`load`), its interval, and the speedups either side.

    `lower`/`upper` None: that bound lies beyond the observed loads. `below`/`above`: the
    speedup (exp of the request-weighted mean log speedup) of the groups below and above the
    crossover (None: no such group)."""

    status: CrossoverStatus
    load: float | None
    lower: float | None
    upper: float | None
    confidence: float
    observed: tuple[float, float] | None  # (lowest, highest) group mean load
    below: float | None
    above: float | None
    groups: tuple[tuple[float, float, int, int], ...]  # (mean load, speedup, n control, n treat)
    block_units: int

    def to_dict(self) -> CrossoverResult:
        return {
            "status": self.status,
            "load": self.load,
            "lower": self.lower,
            "upper": self.upper,
            "confidence": self.confidence,
            "observed": list(self.observed) if self.observed is not None else None,
            "speedup_below": self.below,
            "speedup_above": self.above,
            "groups": [
                {"load": x, "speedup": s, "n": {"control": nc, "treatment": nt}}
                for x, s, nc, nt in self.groups
            ],
            "block_units": self.block_units,
        }


def decreasing_fit(y: FloatArray, w: FloatArray) -> FloatArray:
    """The weighted least-squares non-increasing fit of `y` (pool adjacent violators)."""
    values: list[float] = []
    weights: list[float] = []
    sizes: list[int] = []
    for yi, wi in zip(y.tolist(), w.tolist(), strict=True):
        values.append(yi)
        weights.append(wi)
        sizes.append(1)
        while len(values) > 1 and values[-2] < values[-1]:
            total = weights[-2] + weights[-1]
            merged = (values[-2] * weights[-2] + values[-1] * weights[-1]) / total
            values[-2:] = [merged]
            weights[-2:] = [total]
            sizes[-2:] = [sizes[-2] + sizes[-1]]
    return np.repeat(np.array(values), sizes)


def first_crossing(x: FloatArray, fit: FloatArray) -> float:
    """Where a non-increasing fit at loads `x` first reaches 0, interpolated linearly; +inf when
    it stays above 0, -inf when it starts at or below 0."""
    if fit[0] <= 0:
        return -math.inf
    below = np.flatnonzero(fit <= 0)
    if below.size == 0:
        return math.inf
    j = int(below[0])
    x0, x1, y0, y1 = float(x[j - 1]), float(x[j]), float(fit[j - 1]), float(fit[j])
    return x0 + (x1 - x0) * y0 / (y0 - y1)


def _per_load(arm: LoadSample, loads: FloatArray, weights: FloatArray) -> FloatArray:
    at = np.searchsorted(loads, arm.load)
    return np.bincount(at, weights=weights, minlength=loads.size).astype(np.float64)


def _groups(
    control: LoadSample, treatment: LoadSample, loads: FloatArray, min_group: int
) -> IntArray:
    """The group (0..) of each distinct load, lowest first; loads merged until each group holds
    `min_group` requests per arm (a short last group joins the one before)."""
    nc = _per_load(control, loads, control.n)
    nt = _per_load(treatment, loads, treatment.n)
    group = np.zeros(loads.size, dtype=np.int64)
    g, have_c, have_t = 0, 0.0, 0.0
    for i in range(loads.size):
        group[i] = g
        have_c += float(nc[i])
        have_t += float(nt[i])
        if have_c >= min_group and have_t >= min_group:
            g, have_c, have_t = g + 1, 0.0, 0.0
    if loads.size and (have_c or have_t) and g > 0:  # the short tail joins the group before
        group[group == g] = g - 1
    return group


def _block_units(
    control: LoadSample, treatment: LoadSample, units: int, group_of: IntArray, loads: FloatArray
) -> int:
    """The comparison's block rule on each arm's per-unit mean of log latency less its load
    group's mean: the dependence in time that is not the load's own (a run whose load changes
    slowly would otherwise ask for blocks as long as its load's phases)."""
    series = []
    for arm in (control, treatment):
        g = group_of[np.searchsorted(loads, arm.load)]
        count = np.bincount(g, weights=arm.n)
        mean = np.bincount(g, weights=arm.log_sum) / np.maximum(count, 1)
        resid = arm.log_sum - arm.n * mean[g]
        n = np.bincount(arm.unit, weights=arm.n, minlength=units)
        total = np.bincount(arm.unit, weights=resid, minlength=units)
        with np.errstate(invalid="ignore", divide="ignore"):
            series.append(np.where(n > 0, total / n, np.nan))
    return plan_blocks(series, units).block_units


def _expansion(blocks: IntArray, confidence: float) -> FloatArray:
    """Per group holding k time blocks, sqrt(k / (k - 1)) t_(k-1) / z: the factor a percentile
    interval over k resampled blocks is widened by (`blockboot`, here with k - 1 degrees of
    freedom); 1 with a single block (its replicates do not vary)."""
    tail = 0.5 + confidence / 2.0
    z = float(scipy_stats.norm.ppf(tail))
    out = np.ones(blocks.size)
    for g, k in enumerate(blocks.tolist()):
        if k >= 2:
            out[g] = math.sqrt(k / (k - 1)) * float(scipy_stats.t.ppf(tail, k - 1)) / z
    return out


def crossover(
    control: LoadSample,
    treatment: LoadSample,
    *,
    units: int,
    rng: np.random.Generator,
    resamples: int = 1000,
    confidence: float = 0.95,
    block_units: int | None = None,
    min_group: int = MIN_GROUP,
    piece_units: int = 1,
    log_error: float = 0.0,
    load_error: Callable[[float], float] | None = None,
) -> Crossover:
    """The crossover load of `treatment` against `control` (module docstring). `block_units`:
    time units per bootstrap block (None: the comparison's own rule, `blocklength.plan_blocks`
    on each arm's per-unit mean log latency). `piece_units`: units a cell may stand for (an
    hour block's at its first unit): blocks are whole pieces. `log_error`: how far each
    request's log latency in the cells may lie from its own (binned values): each arm's mean
    log of a group is within it, so the interval's bounds are taken where the replicates' fits
    reach -2 and +2 `log_error`, and hold the crossing of the exact values' fit. `load_error`:
    how far a cell's load may lie from its requests' own, at a load (a summary key's middle
    for the calls in flight it gathers): each bound moves out by it."""
    if piece_units > 1:
        control, treatment = control.in_pieces(piece_units), treatment.in_pieces(piece_units)
        units = math.ceil(units / piece_units)
        if block_units is not None:
            block_units = max(1, block_units // piece_units)
    loads = np.unique(np.concatenate([control.load, treatment.load]))
    group_of = _groups(control, treatment, loads, min_group)
    n_groups = int(group_of.max()) + 1 if group_of.size else 0
    if n_groups < 2:
        return Crossover("too_little_data", None, None, None, confidence, None, None, None, (), 0)
    block = (
        block_units
        if block_units is not None
        else _block_units(control, treatment, units, group_of, loads)
    )
    blocks = max(1, math.ceil(units / block))

    def sums(arm: LoadSample) -> tuple[FloatArray, FloatArray, FloatArray]:
        g = group_of[np.searchsorted(loads, arm.load)]
        b = np.minimum(arm.unit // block, blocks - 1)
        cell = b * n_groups + g
        size = blocks * n_groups
        n = np.bincount(cell, weights=arm.n, minlength=size).astype(np.float64)
        logs = np.bincount(cell, weights=arm.log_sum, minlength=size).astype(np.float64)
        at = np.bincount(cell, weights=arm.load * arm.n, minlength=size).astype(np.float64)
        shape = (blocks, n_groups)
        return n.reshape(shape), logs.reshape(shape), at.reshape(shape)

    c_n, c_log, c_load = sums(control)
    t_n, t_log, t_load = sums(treatment)
    n_c, n_t = c_n.sum(axis=0), t_n.sum(axis=0)
    x = (c_load.sum(axis=0) + t_load.sum(axis=0)) / (n_c + n_t)
    y = c_log.sum(axis=0) / n_c - t_log.sum(axis=0) / n_t
    weight = n_c * n_t / (n_c + n_t)
    fit = decreasing_fit(y, weight)
    point = first_crossing(x, fit)

    # one Poisson weight per (block, group) cell holding requests of either arm, shared by both
    # arms: time blocks resampled within each load group
    cells = np.flatnonzero((c_n + t_n).reshape(-1) > 0)
    cell_group = cells % n_groups
    member = np.zeros((cells.size, n_groups))
    member[np.arange(cells.size), cell_group] = 1.0
    weights = rng.poisson(1.0, size=(resamples, cells.size)).astype(np.float64)

    def replicate(table: FloatArray) -> FloatArray:
        return (weights * table.reshape(-1)[cells]) @ member

    with np.errstate(invalid="ignore", divide="ignore"):
        rc_n, rt_n = replicate(c_n), replicate(t_n)
        ry = replicate(c_log) / rc_n - replicate(t_log) / rt_n
        rw = rc_n * rt_n / (rc_n + rt_n)
    # each group's replicates spread out by the small-sample expansion of its k blocks, as a
    # block interval is widened (`blockboot`): k Poisson-weighted blocks understate the spread
    expansion = _expansion(np.bincount(cell_group, minlength=n_groups), confidence)
    ry = y + expansion * (ry - y)
    # a fit shifted by a constant is the shifted fit (pool adjacent violators): the bounds of
    # binned values are where each replicate's fit reaches -+ the binning's bound
    slack = 2.0 * log_error
    low_found = np.empty(resamples)
    high_found = np.empty(resamples)
    for r in range(resamples):
        ok = np.isfinite(ry[r]) & (rw[r] > 0)
        if not ok.any():
            low_found[r] = high_found[r] = np.nan
            continue
        replicate_fit = decreasing_fit(ry[r][ok], rw[r][ok])
        low_found[r] = first_crossing(x[ok], replicate_fit - slack)
        high_found[r] = (
            low_found[r] if slack == 0.0 else first_crossing(x[ok], replicate_fit + slack)
        )
    low_found = np.sort(low_found[~np.isnan(low_found)])
    high_found = np.sort(high_found[~np.isnan(high_found)])
    tail = (1.0 - confidence) / 2.0
    lo = hi = math.nan
    if low_found.size:  # order statistics, not interpolated: a bound may be an infinity
        lo = float(low_found[max(0, math.ceil(tail * low_found.size) - 1)])
        hi = float(high_found[min(high_found.size - 1, math.floor((1.0 - tail) * high_found.size))])
    if load_error is not None:
        lo = lo - load_error(lo) if math.isfinite(lo) else lo
        hi = hi + load_error(hi) if math.isfinite(hi) else hi

    def bound(v: float) -> float | None:
        return v if math.isfinite(v) else None

    def side(mask: npt.NDArray[np.bool_]) -> float | None:
        if not mask.any():
            return None
        return float(math.exp(float(np.sum(y[mask] * weight[mask]) / np.sum(weight[mask]))))

    status: CrossoverStatus = (
        "ok" if math.isfinite(point) else "helps_throughout" if point > 0 else "costs_throughout"
    )
    groups = tuple(
        (float(x[i]), float(math.exp(y[i])), int(n_c[i]), int(n_t[i])) for i in range(n_groups)
    )
    return Crossover(
        status=status,
        load=bound(point),
        lower=bound(lo),
        upper=bound(hi),
        confidence=confidence,
        observed=(float(x[0]), float(x[-1])),
        below=side(x < point) if math.isfinite(point) else None,
        above=side(x > point) if math.isfinite(point) else None,
        groups=groups,
        block_units=block * piece_units,
    )
