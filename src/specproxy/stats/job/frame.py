"""Windows over a run's summaries: which units each window spans, and each arm's `ArmWindow`.

The summaries (`Tiers`) come from the store (minute units: fine minutes, compacted 1-minute and
hour blocks, `cache`) or from rows (`rows`: fine units of a second or more); either way a window
becomes `ArmWindow`s the same way. A window is whole units [lo, hi]; one that reaches hour blocks
is widened to whole hours, its bootstrap blocks are whole hours and its block-length rule reads
the per-minute log of the mean (the per-minute histograms are gone); one that reaches compacted
histograms states the coarse grid's bound. Warm-up (`stats.warmup`) leaves out whole units; a
block holding an excluded unit is left out whole. Segments are the summaries' keys (the model);
the conditions' summaries (`summary.conditions`) are keyed by condition, and `ConditionSamples`
gives a window's sample of any set of their keys (a band) the same way.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm
from specproxy.stats.job.cache import ArmTier
from specproxy.stats.sample import ArmSample, ArmWindow
from specproxy.summary.conditions import CONDITION_METRICS
from specproxy.summary.grid import COARSE_ERROR_BOUND, GRID_ERROR_BOUND
from specproxy.summary.histogram import coarse_as_fine, coarse_bin
from specproxy.summary.minute import MOMENT_SUMS
from specproxy.summary.tiering import HOUR_SPAN, MINUTE_SPAN

__all__ = ["ConditionSamples", "Frame", "Tiers", "WindowPlan", "segments_by_label"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Segments = frozenset[str] | None  # the summary keys a selection takes (None: every key)
# (unit or hour start, segment, arm name, *MOMENT_SUMS)
MomentRow = Sequence[Any]


@dataclass(slots=True)
class Tiers:
    """One run's summaries, in units of `unit_s` seconds: per metric and arm the blocks and fine
    units (`cache.ArmTier`), and the length adjustment's moments per fine unit and per hour block
    (rows `(start, segment, arm, *MOMENT_SUMS)`; hour starts in units)."""

    unit_s: float
    metrics: dict[str, dict[Arm, ArmTier]]
    moment_units: Sequence[MomentRow] = field(default_factory=list)
    moment_hours: Sequence[MomentRow] = field(default_factory=list)
    has_moments: bool = True

    def unit_counts(self, arm: Arm) -> tuple[IntArray, IntArray]:
        """(unit, usable e2e requests) per unit of `arm` holding any."""
        tier = self.metrics.get("e2e", {}).get(arm)
        if tier is None:
            empty = np.zeros(0, dtype=np.int64)
            return empty, empty
        return tier.minute_counts()

    @property
    def arms(self) -> list[Arm]:
        """Every arm some metric holds a tier of, in name order."""
        return sorted({arm for per_arm in self.metrics.values() for arm in per_arm})

    def keys(self) -> set[str]:
        out: set[str] = set()
        for per_arm in self.metrics.values():
            for tier in per_arm.values():
                out.update(key for _start, _span, key in tier.blocks)
                out.update(key for _unit, key in tier.fine)
        return out


def segments_by_label(
    tiers: Tiers, label: Callable[[str], str] | None
) -> dict[str, frozenset[str]]:
    """The segment labels of the summaries, each with the stored keys it gathers."""
    groups: dict[str, set[str]] = {}
    for key in tiers.keys():  # noqa: SIM118 - Tiers.keys() is a method, not a dict view
        groups.setdefault(label(key) if label is not None else key, set()).add(key)
    return {name: frozenset(keys) for name, keys in sorted(groups.items())}


@dataclass(frozen=True, slots=True)
class WindowPlan:
    """A window's units [lo, hi] after widening to whole compacted blocks."""

    window_s: float | None  # None: the whole run
    lo: int
    hi: int
    unit_s: float
    hourly: bool  # hour blocks inside: units from an hour boundary, bootstrap blocks whole hours
    coarse: bool  # compacted (0.5 %) histograms inside

    @property
    def units(self) -> int:
        return self.hi - self.lo + 1

    @property
    def start(self) -> float:
        return self.lo * self.unit_s

    @property
    def span(self) -> tuple[float, float]:
        return (self.lo * self.unit_s, (self.hi + 1) * self.unit_s)

    @property
    def grid_error(self) -> float:
        return COARSE_ERROR_BOUND if self.coarse else GRID_ERROR_BOUND


@dataclass(frozen=True, slots=True)
class Frame:
    """Where a run's summaries lie, and the window end every window is measured from.

    `limit` (`Frame.of`): the latest time a unit may start and still be data, now plus the skew
    allowance (`StatsConfig.future_skew_s`). Units starting after it hold future rows (a clock
    stepped back, a replica's clock running fast): they are in no window and set no horizon,
    and `future` counts their usable requests, `future_end` the end of the last of them."""

    window_end: float
    horizon: float | None  # end of the last unit holding data (capped at window_end)
    first_unit: int
    last_unit: int
    future: int = 0  # usable requests in units after the limit
    future_end: float | None = None  # end of the last unit after the limit holding any

    @classmethod
    def of(
        cls, tiers: Tiers, window_end: float | None, now: float, limit: float | None = None
    ) -> Frame:
        bound = math.floor(limit / tiers.unit_s) if limit is not None else None
        used: list[int] = []
        first: list[int] = []
        future = 0
        ahead: list[int] = []
        for arm in tiers.arms:
            units, counts = tiers.unit_counts(arm)
            if bound is not None:
                late = units > bound
                if late.any():
                    future += int(counts[late].sum())
                    ahead.append(int(units[late].max()))
                    units = units[~late]
            if units.size:
                used.append(int(units.max()))
                first.append(int(units.min()))
        horizon = (max(used) + 1) * tiers.unit_s if used else None
        end = window_end if window_end is not None else horizon if horizon is not None else now
        if limit is not None:
            end = min(end, limit)
        if horizon is not None:
            horizon = min(horizon, end)
        last = math.floor(end / tiers.unit_s)
        future_end = (max(ahead) + 1) * tiers.unit_s if ahead else None
        return cls(end, horizon, min(first) if first else last, last, future, future_end)

    def plan(self, tiers: Tiers, window_s: float | None) -> WindowPlan:
        """The units of the window of `window_s` seconds (None: the whole run)."""
        lo = self.first_unit
        if window_s is not None:
            lo = max(math.floor((self.window_end - window_s) / tiers.unit_s), lo)
        lo, hi = min(lo, self.last_unit), self.last_unit
        if tiers.unit_s < 60.0:  # units that divide a minute start on one: minutes nest in them
            lo -= lo % round(60.0 / tiers.unit_s)
        hourly = coarse = False
        for per_arm in tiers.metrics.values():
            for tier in per_arm.values():
                for start, span, _key in tier.blocks:
                    if start <= hi and start + span > lo:
                        coarse = True
                        if span > MINUTE_SPAN:
                            hourly = True
                            hi = max(hi, start + span - 1)
        if hourly:
            lo -= lo % HOUR_SPAN
        return WindowPlan(window_s, lo, hi, tiers.unit_s, hourly, coarse)


def _joined(parts: list[IntArray]) -> IntArray:
    """The parts end to end, always a new array (parts may be the cache's own arrays)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _sample(
    tier: ArmTier, plan: WindowPlan, excluded: set[int], keys: Segments
) -> tuple[ArmSample, int]:
    """The window's sample of one arm and metric minus `excluded` units, and the requests
    excluded (a block holding an excluded unit is left out whole)."""
    lo, units = plan.lo, plan.units
    unit_n = np.zeros(units, dtype=np.int64)
    unit_sum = np.zeros(units, dtype=np.float64)
    dropped = 0
    chosen = []
    ordered = sorted(excluded)
    for (start, width, key), block in tier.blocks.items():
        if start < lo or start > plan.hi or (keys is not None and key not in keys):
            continue
        first = bisect.bisect_left(ordered, start)
        if first < len(ordered) and ordered[first] < start + width:
            dropped += block.n
            continue
        chosen.append(block)
    where: list[IntArray] = []
    bins: list[IntArray] = []
    counts: list[IntArray] = []
    if chosen:
        # every block at once: unit vectors into the unit arrays, and the occupied bins of its
        # dense coarse counts as entries at its first unit
        offs = np.array([b.start - lo for b in chosen], dtype=np.int64)
        spans = np.array([b.span for b in chosen], dtype=np.int64)
        unit_at = np.repeat(offs - np.cumsum(spans) + spans, spans) + np.arange(spans.sum())
        unit_n += np.bincount(
            unit_at, weights=np.concatenate([b.minute_n for b in chosen]), minlength=units
        ).astype(np.int64)
        unit_sum += np.bincount(
            unit_at, weights=np.concatenate([b.minute_total for b in chosen]), minlength=units
        )
        ks = np.array([b.counts.size for b in chosen], dtype=np.int64)
        firsts = np.array([b.lo for b in chosen], dtype=np.int64)
        dense = np.concatenate([b.counts for b in chosen])
        at = np.flatnonzero(dense)
        starts = np.cumsum(ks) - ks
        per_block = np.diff(np.searchsorted(at, np.append(starts, dense.size)))
        where.append(np.repeat(offs, per_block))
        bins.append(coarse_as_fine(at - np.repeat(starts - firsts, per_block)))
        counts.append(dense[at])
    for (unit, key), fine in tier.fine.items():
        if unit < lo or unit > plan.hi or (keys is not None and key not in keys):
            continue
        if unit in excluded:
            dropped += fine.n
            continue
        unit_n[unit - lo] += fine.n
        unit_sum[unit - lo] += fine.total
        fine_bins, fine_counts = fine.bins, fine.counts
        if not bool(np.all(fine_counts)):
            occupied = np.flatnonzero(fine_counts)
            fine_bins, fine_counts = fine_bins[occupied], fine_counts[occupied]
        where.append(np.full(fine_bins.size, unit - lo, dtype=np.int64))
        # beside compacted data the window's bound is the coarse one anyway: one grid for it
        bins.append(coarse_as_fine(coarse_bin(fine_bins)) if plan.coarse else fine_bins)
        counts.append(fine_counts)
    series = None
    if plan.hourly:
        with np.errstate(invalid="ignore", divide="ignore"):
            series = np.where(unit_n > 0, np.log(unit_sum / np.maximum(unit_n, 1)), np.nan)
    sample = ArmSample(
        units=units,
        unit=_joined(where),
        bins=_joined(bins),
        counts=_joined(counts),
        unit_n=unit_n,
        unit_sum=unit_sum,
        unit_s=plan.unit_s,
        piece_units=HOUR_SPAN if plan.hourly else 1,
        series=series,
        grid_error=plan.grid_error,
    )
    return sample, dropped


def _moments(
    tiers: Tiers, plan: WindowPlan, arm: Arm, excluded: set[int], keys: Segments
) -> FloatArray | None:
    """The window's MOMENT_SUMS per unit for one arm (units x 10): hour rows when its bootstrap
    blocks are whole hours, else unit rows; a unit holding an excluded unit is left out, as its
    histograms are. None when the summaries hold none for the window."""
    if not tiers.has_moments:
        return None
    out = np.zeros((plan.units, len(MOMENT_SUMS)))
    width = HOUR_SPAN if plan.hourly else 1
    found = False
    for start, key, arm_name, *sums in tiers.moment_hours if plan.hourly else tiers.moment_units:
        start_unit = int(start)
        if start_unit < plan.lo or start_unit > plan.hi or arm_name != arm:
            continue
        if keys is not None and key not in keys:
            continue
        if any(u in excluded for u in range(start_unit, start_unit + width)):
            continue
        out[start_unit - plan.lo] += np.asarray(sums, dtype=np.float64)
        found = True
    return out if found else None


def arm_window(
    tiers: Tiers, plan: WindowPlan, arm: Arm, excluded: set[int], keys: Segments
) -> ArmWindow:
    """One arm's samples of every summarised metric over the window, its moments and the
    usable requests warm-up left out (e2e's)."""
    samples: dict[str, ArmSample] = {}
    dropped = 0
    for metric, per_arm in tiers.metrics.items():
        tier = per_arm.get(arm)
        sample, excluded_n = _sample(tier if tier is not None else ArmTier(), plan, excluded, keys)
        samples[metric] = sample
        if metric == "e2e":
            dropped = excluded_n
    return ArmWindow(samples, _moments(tiers, plan, arm, excluded, keys), dropped)


@dataclass(frozen=True, slots=True)
class ConditionSamples:
    """One arm's condition summaries over a window (`summary.conditions`): the keys each
    compared metric holds and the window's sample of any set of them (a band), in the one sample
    form, warm-up units left out as the window's own. Stored condition rollups are on the
    coarse grid, so each sample states its bound (`COARSE_ERROR_BOUND`)."""

    parts: dict[str, dict[str, ArmTier]]  # compared metric -> key -> that key's rollups
    plan: WindowPlan
    excluded: frozenset[int]

    @classmethod
    def of(cls, tiers: Tiers, plan: WindowPlan, arm: Arm, excluded: set[int]) -> ConditionSamples:
        parts: dict[str, dict[str, ArmTier]] = {}
        for stored, (metric, _attr) in CONDITION_METRICS.items():
            tier = tiers.metrics.get(stored, {}).get(arm)
            by_key: dict[str, ArmTier] = {}
            if tier is not None:
                for block_key, block in tier.blocks.items():
                    by_key.setdefault(block_key[2], ArmTier()).blocks[block_key] = block
                for fine_key, fine in tier.fine.items():
                    by_key.setdefault(fine_key[1], ArmTier()).fine[fine_key] = fine
            parts[metric] = by_key
        return cls(parts, plan, frozenset(excluded))

    def keys(self, metric: str) -> list[str]:
        """Every key of `metric` the run's summaries hold (some may be empty in the window)."""
        return sorted(self.parts.get(metric, {}))

    def sample(self, metric: str, keys: frozenset[str]) -> ArmSample:
        """The window's sample of the requests under any of `keys`."""
        parts = self.parts.get(metric, {})
        merged = ArmTier()
        for key in keys:
            part = parts.get(key)
            if part is not None:
                merged.blocks.update(part.blocks)
                merged.fine.update(part.fine)
        sample, _dropped = _sample(merged, self.plan, set(self.excluded), None)
        return dataclasses.replace(sample, grid_error=COARSE_ERROR_BOUND)

    def count(self, metric: str, key: str) -> int:
        """The requests under `key` that the window's sample of it holds."""
        part = self.parts.get(metric, {}).get(key)
        if part is None:
            return 0
        lo, hi, gone = self.plan.lo, self.plan.hi, self.excluded
        n = sum(
            block.n
            for (start, width, _key), block in part.blocks.items()
            if lo <= start <= hi and not any(u in gone for u in range(start, start + width))
        )
        return n + sum(
            fine.n
            for (unit, _key), fine in part.fine.items()
            if lo <= unit <= hi and unit not in gone
        )
