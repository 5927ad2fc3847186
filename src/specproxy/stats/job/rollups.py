"""The stats job's result computed from per-minute rollups (pure; CPU only).

When (`stats.raw_rows_max`): a run with more usable requests on its larger arm than
`raw_rows_max` is analysed from rollups, every window of it, so one tick has one method and its
cost depends on minutes x occupied bins, never on rows. Smaller runs keep the exact row path
(`job.compute_from_arrays`). Both paths agree within the grid bound (tests/stats/
test_rollupcompare.py).

What changes on rollups (stated in the result):
  * windows are whole minutes: [floor((end - w) / 60), floor(end / 60)];
  * the model breakdown: "all" (every model's rollups summed) and one result per model label
    found in the rollups (the store keys them by the bounded label, `rollup`; `model_label`
    maps them again as the row path does, so a model no longer served joins "other"). A label
    that holds every rollup of the run reuses the "all" result, as on rows;
  * warm-up is excluded by whole minutes, per arm: the minutes holding the run's first
    `stats.warmup_requests` usable requests, and after each restart the minutes from the
    restart's minute until both `scrape.warmup_requests` requests and `scrape.warmup_seconds`
    have passed (a superset of the row rule, which drops single requests).

Tiers (`store.compaction`, `rollupcache`): fine minutes, compacted 1-minute blocks and hour
blocks are entered as they are (a compacted histogram's bins as the fine bins at their centres):
  * a window that reaches compacted histograms states `grid_error_bound` =
    `loggrid.COARSE_ERROR_BOUND` (0.5 % on a ratio) instead of `GRID_ERROR_BOUND` (0.02 %);
  * a window that reaches hour blocks is widened to whole hours (`minutes` says which), its
    bootstrap blocks are whole hours (`ArmBlocks.piece_units`), and its block-length rule reads
    the per-minute log of the mean (the per-minute histograms are gone);
  * warm-up leaves out a whole block when it holds an excluded minute.
"""

from __future__ import annotations

import bisect
import copy
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.config import ScrapeConfig, StatsConfig
from specproxy.records import Arm, EngineSample, GpuSample
from specproxy.stats.clean import restart_times
from specproxy.stats.compare import CompareSettings
from specproxy.stats.diagnosis import summarise_arms
from specproxy.stats.estimate.blockboot import ArmBlocks
from specproxy.stats.job.cache import ArmTier
from specproxy.stats.rollupcompare import compare_rollup_window
from specproxy.store.contract import MomentRead
from specproxy.summary.engine import EngineView, as_view
from specproxy.summary.grid import COARSE_ERROR_BOUND, GRID_ERROR_BOUND
from specproxy.summary.histogram import coarse_as_fine, coarse_bin
from specproxy.summary.minute import MOMENT_SUMS, ROLLUP_METRICS, ROLLUP_UNIT_S, minute_of
from specproxy.summary.tiering import HOUR_SPAN, MINUTE_SPAN

__all__ = [
    "RollupResults",
    "TickReads",
    "compute_from_rollups",
    "models_by_label",
    "tick_reads",
    "warmup_minutes",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def warmup_minutes(
    minute: IntArray,
    n_per_minute: IntArray,
    restarts: Sequence[float],
    *,
    warmup_requests: int,
    restart_requests: int,
    restart_seconds: float,
) -> set[int]:
    """Minutes of one arm left out as warm-up (the rule in the module docstring), from the
    request count of each minute (a minute may repeat: the counts are summed)."""
    if minute.size == 0:
        return set()
    minutes, inverse = np.unique(minute, return_inverse=True)
    n = np.bincount(inverse, weights=n_per_minute)
    before = np.concatenate([[0.0], np.cumsum(n)[:-1]])
    out = set(minutes[before < warmup_requests].tolist())
    for restart in restarts:
        first = minute_of(restart)
        last_by_time = minute_of(restart + restart_seconds)
        after = minutes >= first
        counted = np.cumsum(np.where(after, n, 0.0)) - np.where(after, n, 0.0)
        by_count = minutes[after & (counted < restart_requests)]
        last = max(last_by_time, int(by_count.max()) if by_count.size else first)
        out.update(range(first, last + 1))
    return out


@dataclass(frozen=True, slots=True)
class _Span:
    """A window's minutes after widening to whole compacted blocks."""

    lo: int
    hi: int
    hourly: bool  # hour blocks inside: units from an hour boundary, bootstrap blocks whole hours
    coarse: bool  # compacted (0.5 %) histograms inside


def _span(tiers: dict[str, dict[Arm, ArmTier]], lo: int, hi: int) -> _Span:
    hourly = coarse = False
    for per_arm in tiers.values():
        for tier in per_arm.values():
            for start, span, _model in tier.blocks:
                if start <= hi and start + span > lo:
                    coarse = True
                    if span > MINUTE_SPAN:
                        hourly = True
                        hi = max(hi, start + span - 1)
    if hourly:
        lo -= lo % HOUR_SPAN
    return _Span(lo, hi, hourly, coarse)


def _joined(parts: list[IntArray]) -> IntArray:
    """The parts end to end, always a new array (parts may be the cache's own arrays)."""
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def _window_blocks(
    tier: ArmTier, span: _Span, excluded: set[int], models: frozenset[str] | None = None
) -> tuple[ArmBlocks, int]:
    """ArmBlocks of the window's minutes minus `excluded` (a block holding an excluded minute is
    left out whole: its histogram cannot be split); also the excluded request count. `models`:
    only the rollups stored under these model keys (None: every model)."""
    lo, units = span.lo, span.hi - span.lo + 1
    unit_n = np.zeros(units, dtype=np.int64)
    unit_sum = np.zeros(units, dtype=np.float64)
    dropped = 0
    chosen = []
    ordered = sorted(excluded)
    for (start, width, model), block in tier.blocks.items():
        if start < lo or start > span.hi or (models is not None and model not in models):
            continue
        first = bisect.bisect_left(ordered, start)  # an excluded minute inside the block?
        if first < len(ordered) and ordered[first] < start + width:
            dropped += block.n
            continue
        chosen.append(block)
    # every chosen block at once: minute vectors into the unit arrays, and the occupied bins of
    # its dense coarse counts as entries at its first minute. Only occupied positions are turned
    # into entries (a 30-day window's hour blocks hold ~1.1M dense counts per arm, ~30 % empty):
    # fewer and smaller temporaries, which a new leader's first tick pays for in page faults.
    where: list[IntArray] = []
    bins: list[IntArray] = []
    counts: list[IntArray] = []
    if chosen:
        offs = np.array([b.start - lo for b in chosen], dtype=np.int64)
        spans = np.array([b.span for b in chosen], dtype=np.int64)
        minute_at = np.repeat(offs - np.cumsum(spans) + spans, spans) + np.arange(spans.sum())
        unit_n += np.bincount(
            minute_at, weights=np.concatenate([b.minute_n for b in chosen]), minlength=units
        ).astype(np.int64)
        unit_sum += np.bincount(
            minute_at, weights=np.concatenate([b.minute_total for b in chosen]), minlength=units
        )
        ks = np.array([b.counts.size for b in chosen], dtype=np.int64)
        firsts = np.array([b.lo for b in chosen], dtype=np.int64)
        dense = np.concatenate([b.counts for b in chosen])
        at = np.flatnonzero(dense)  # occupied positions, block after block
        starts = np.cumsum(ks) - ks
        per_block = np.diff(np.searchsorted(at, np.append(starts, dense.size)))
        where.append(np.repeat(offs, per_block))
        # position p of block i is coarse bin firsts[i] + p - starts[i]
        bins.append(coarse_as_fine(at - np.repeat(starts - firsts, per_block)))
        counts.append(dense[at])
    for (minute, model), fine in tier.fine.items():
        if minute < lo or minute > span.hi or (models is not None and model not in models):
            continue
        if minute in excluded:
            dropped += fine.n
            continue
        unit_n[minute - lo] += fine.n
        unit_sum[minute - lo] += fine.total
        fine_bins, fine_counts = fine.bins, fine.counts
        if not bool(np.all(fine_counts)):
            occupied = np.flatnonzero(fine_counts)
            fine_bins, fine_counts = fine_bins[occupied], fine_counts[occupied]
        where.append(np.full(fine_bins.size, minute - lo, dtype=np.int64))
        # beside compacted data the window's bound is the coarse one anyway: coarsen the fine
        # minutes too (one grid for the window, ~20x fewer distinct bins to bootstrap over)
        bins.append(coarse_as_fine(coarse_bin(fine_bins)) if span.coarse else fine_bins)
        counts.append(fine_counts)
    series = None
    if span.hourly:
        with np.errstate(invalid="ignore", divide="ignore"):
            series = np.where(unit_n > 0, np.log(unit_sum / np.maximum(unit_n, 1)), np.nan)
    blocks = ArmBlocks(
        units=units,
        unit=_joined(where),
        bins=_joined(bins),
        counts=_joined(counts),
        unit_n=unit_n,
        unit_sum=unit_sum,
        piece_units=HOUR_SPAN if span.hourly else 1,
        series=series,
    )
    return blocks, dropped


@dataclass(frozen=True, slots=True)
class RollupResults:
    """What `stats.job` wraps into its result envelope."""

    results: dict[str, Any]  # {"all" or model label: {window label: window result}}
    window_end: float
    data_horizon: float | None  # end of the last minute holding data (capped at window_end)


@dataclass(frozen=True, slots=True)
class _Frame:
    """Where the run's rollups lie: per arm (minute, n) of e2e, and the minutes bounding every
    window."""

    e2e: dict[Arm, tuple[IntArray, IntArray]]
    window_end: float
    horizon: float | None
    start_minute: int
    end_minute: int

    def span(self, tiers: dict[str, dict[Arm, ArmTier]], window_s: float | None) -> _Span:
        """The minutes of the window of `window_s` seconds (None: the whole run)."""
        lo = (
            self.start_minute
            if window_s is None
            else max(minute_of(self.window_end - window_s), self.start_minute)
        )
        return _span(tiers, min(lo, self.end_minute), self.end_minute)


def _frame(tiers: dict[str, dict[Arm, ArmTier]], window_end: float | None) -> _Frame:
    e2e = {arm: tiers["e2e"][arm].minute_counts() for arm in Arm}
    used = [int(m.max()) for m, _n in e2e.values() if m.size]
    first = [int(m.min()) for m, _n in e2e.values() if m.size]
    horizon = (max(used) + 1) * ROLLUP_UNIT_S if used else None
    if window_end is None:
        window_end = horizon if horizon is not None else time.time()
    if horizon is not None:
        horizon = min(horizon, window_end)
    end_minute = minute_of(window_end)
    start_minute = min(first) if first else end_minute
    return _Frame(e2e, window_end, horizon, start_minute, end_minute)


def models_by_label(
    tiers: dict[str, dict[Arm, ArmTier]], model_label: Callable[[str], str] | None
) -> dict[str, frozenset[str]]:
    """The model labels of the run's rollups, each with the stored model keys it gathers."""
    keys: set[str] = set()
    for per_arm in tiers.values():
        for tier in per_arm.values():
            keys.update(model for _start, _span, model in tier.blocks)
            keys.update(model for _minute, model in tier.fine)
    groups: dict[str, set[str]] = {}
    for key in keys:
        groups.setdefault(model_label(key) if model_label is not None else key, set()).add(key)
    return {label: frozenset(group) for label, group in sorted(groups.items())}


@dataclass(frozen=True, slots=True)
class TickReads:
    """What a tick reads from the store besides the tiers, and the window end to pass on to
    `compute_from_rollups`."""

    window_end: float
    engine_starts: list[float]  # each window's first minute, s (`SummaryReader.read_engine`)
    moments_from: (
        int  # first minute of moment rows (`SummaryReader.read_moments`): the windows that
    )
    # do not reach hour blocks take minute rows, the others hour rows


def tick_reads(
    tiers: dict[str, dict[Arm, ArmTier]],
    windows: Sequence[float | None],
    window_end: float | None,
) -> TickReads:
    frame = _frame(tiers, window_end)
    spans = [frame.span(tiers, w) for w in windows]
    by_minute = [span.lo for span in spans if not span.hourly]
    return TickReads(
        frame.window_end,
        [span.lo * ROLLUP_UNIT_S for span in spans],
        min(by_minute) if by_minute else frame.end_minute + 1,
    )


def _unit_moments(
    moments: MomentRead, span: _Span, excluded: dict[Arm, set[int]], models: frozenset[str] | None
) -> dict[Arm, FloatArray] | None:
    """Per arm the window's MOMENT_SUMS per unit (units x 10): hour rows when its bootstrap
    blocks are whole hours, else minute rows; a unit holding an excluded (warm-up) minute is
    left out, as its histograms are. None when the store has no moments in the window."""
    units = span.hi - span.lo + 1
    out = {arm: np.zeros((units, len(MOMENT_SUMS))) for arm in Arm}
    width = HOUR_SPAN if span.hourly else 1
    found = False
    for start, model, arm_name, *sums in moments.hours if span.hourly else moments.minutes:
        if start < span.lo or start > span.hi or (models is not None and model not in models):
            continue
        arm = Arm(arm_name)
        if any(m in excluded[arm] for m in range(start, start + width)):
            continue
        out[arm][start - span.lo] += sums
        found = True
    return out if found else None


def compute_from_rollups(
    tiers: dict[str, dict[Arm, ArmTier]],
    engine_samples: Sequence[EngineSample] | EngineView,
    *,
    windows: Sequence[tuple[float | None, str]],
    stats_cfg: StatsConfig,
    scrape_cfg: ScrapeConfig,
    window_end: float | None = None,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None = None,
    model_label: Callable[[str], str] | None = None,
    moments: MomentRead | None = None,
) -> RollupResults:
    """Every window (`(seconds or None, label)`) from the run's rollups, `tiers[metric][arm]`,
    for "all" and per model label (`models_by_label`); `gpu_samples`: the GPU telemetry of the
    arms that have it, as for `job.compute_from_arrays`. `engine_samples`: the run's engine
    samples or a store's `engineagg.StoredView` of them (holding the aggregates from
    `tick_reads`); `moments`: the store's moment rows from `tick_reads().moments_from` (None:
    no length adjustment)."""
    frame = _frame(tiers, window_end)
    e2e, window_end, horizon = frame.e2e, frame.window_end, frame.horizon
    engine_view = as_view(engine_samples)
    excluded = {
        arm: warmup_minutes(
            *e2e[arm],
            restart_times(engine_view.restart_samples, arm),
            warmup_requests=stats_cfg.warmup_requests,
            restart_requests=scrape_cfg.warmup_requests,
            restart_seconds=scrape_cfg.warmup_seconds,
        )
        for arm in Arm
    }
    settings = CompareSettings.from_config(stats_cfg)
    rng = np.random.default_rng(stats_cfg.seed)
    # per window: its minutes and its engine summary (one per window, shared by the models)
    spans = []
    for window_s, label in windows:
        span = frame.span(tiers, window_s)
        engine = summarise_arms(engine_view, gpu_samples, since=span.lo * ROLLUP_UNIT_S)
        spans.append((span, window_s, label, engine))

    def windows_of(models: frozenset[str] | None) -> dict[str, Any]:
        per_window: dict[str, Any] = {}
        for span, window_s, label, engine in spans:
            arms: dict[str, dict[Arm, ArmBlocks]] = {}
            n_excluded: dict[str, int] = {}
            for metric in ROLLUP_METRICS:
                arms[metric] = {}
                for arm in Arm:
                    blocks, dropped = _window_blocks(
                        tiers[metric][arm], span, excluded[arm], models
                    )
                    arms[metric][arm] = blocks
                    if metric == "e2e":
                        n_excluded[arm.value] = dropped
            result = compare_rollup_window(
                arms,
                engine=engine,
                settings=settings,
                rng=rng,
                moments=(
                    _unit_moments(moments, span, excluded, models) if moments is not None else None
                ),
            )
            per_window[label] = {
                "window_s": window_s,
                "minutes": [span.lo, span.hi],
                **result,
                "grid_error_bound": COARSE_ERROR_BOUND if span.coarse else GRID_ERROR_BOUND,
                "excluded_warmup": n_excluded,
            }
        return per_window

    results: dict[str, Any] = {"all": windows_of(None)}
    groups = models_by_label(tiers, model_label)
    for model, keys in groups.items():
        # one label holding every rollup of the run: its selections are the "all" ones, and
        # bootstrapping them again would only cost a second tick with other random draws
        results[model] = copy.deepcopy(results["all"]) if len(groups) == 1 else windows_of(keys)
    return RollupResults(results, window_end, horizon)
