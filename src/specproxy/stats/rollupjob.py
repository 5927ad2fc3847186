"""The stats job's result computed from per-minute rollups (pure; CPU only).

When (`stats.raw_rows_max`): a run with more usable requests on its larger arm than
`raw_rows_max` is analysed from rollups, every window of it, so one tick has one method and its
cost depends on minutes x occupied bins, never on rows. Smaller runs keep the exact row path
(`job.compute_from_arrays`). Both paths agree within the grid bound (tests/stats/
test_rollupcompare.py).

What changes on rollups (stated in the result):
  * windows are whole minutes: [floor((end - w) / 60), floor(end / 60)];
  * the model breakdown is "all" only (rollups of every model are summed);
  * warm-up is excluded by whole minutes, per arm: the minutes holding the run's first
    `stats.warmup_requests` usable requests, and after each restart the minutes from the
    restart's minute until both `scrape.warmup_requests` requests and `scrape.warmup_seconds`
    have passed (a superset of the row rule, which drops single requests).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.config import ScrapeConfig, StatsConfig
from specproxy.records import Arm, EngineSample, GpuSample
from specproxy.rollup import ROLLUP_METRICS, ROLLUP_UNIT_S, minute_of
from specproxy.stats.blockboot import ArmBlocks
from specproxy.stats.clean import restart_times
from specproxy.stats.compare import CompareSettings
from specproxy.stats.diagnosis import summarise_arms
from specproxy.stats.rollupcompare import compare_rollup_window
from specproxy.store.rollups import RollupRows

__all__ = ["RollupResults", "compute_from_rollups", "warmup_minutes"]

IntArray = npt.NDArray[np.int64]


def warmup_minutes(
    rows: RollupRows,
    restarts: Sequence[float],
    *,
    warmup_requests: int,
    restart_requests: int,
    restart_seconds: float,
) -> set[int]:
    """Minutes of one arm left out as warm-up (the rule in the module docstring)."""
    if rows.minute.size == 0:
        return set()
    minutes, inverse = np.unique(rows.minute, return_inverse=True)
    n = np.bincount(inverse, weights=rows.n)
    before = np.concatenate([[0.0], np.cumsum(n)[:-1]])
    out = {int(m) for m, b in zip(minutes, before, strict=True) if b < warmup_requests}
    for restart in restarts:
        first = minute_of(restart)
        last_by_time = minute_of(restart + restart_seconds)
        after = minutes >= first
        counted = np.cumsum(np.where(after, n, 0.0)) - np.where(after, n, 0.0)
        by_count = minutes[after & (counted < restart_requests)]
        last = max(last_by_time, int(by_count.max()) if by_count.size else first)
        out.update(range(first, last + 1))
    return out


def _window_blocks(rows: RollupRows, lo: int, hi: int, excluded: set[int]) -> tuple[ArmBlocks, int]:
    """ArmBlocks of minutes [lo, hi] minus `excluded`; also the excluded request count."""
    drop = np.isin(rows.minute, list(excluded)) if excluded else np.zeros(rows.minute.size, bool)
    in_window = (rows.minute >= lo) & (rows.minute <= hi)
    keep_bins = (rows.bin_minute >= lo) & (rows.bin_minute <= hi)
    if excluded:
        keep_bins &= ~np.isin(rows.bin_minute, list(excluded))
    kept = RollupRows(
        minute=rows.minute[in_window & ~drop],
        n=rows.n[in_window & ~drop],
        total=rows.total[in_window & ~drop],
        total_sq=rows.total_sq[in_window & ~drop],
        bin_minute=rows.bin_minute[keep_bins],
        bins=rows.bins[keep_bins],
        counts=rows.counts[keep_bins],
    )
    return ArmBlocks.from_rollups(kept, lo, hi - lo + 1), int(rows.n[in_window & drop].sum())


@dataclass(frozen=True, slots=True)
class RollupResults:
    """What `stats.job` wraps into its result envelope."""

    results: dict[str, Any]  # {"all": {label: window result}}
    window_end: float
    data_horizon: float | None  # end of the last minute holding data (capped at window_end)


def compute_from_rollups(
    rollups: dict[str, dict[Arm, RollupRows]],
    engine_samples: Sequence[EngineSample],
    *,
    windows: Sequence[tuple[float | None, str]],
    stats_cfg: StatsConfig,
    scrape_cfg: ScrapeConfig,
    window_end: float | None = None,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None = None,
) -> RollupResults:
    """Every window (`(seconds or None, label)`) from the run's rollups, `rollups[metric][arm]`;
    `gpu_samples`: the GPU telemetry of the arms that have it, as for `job.compute_from_arrays`."""
    e2e = rollups["e2e"]
    used = [int(r.minute.max()) for r in e2e.values() if r.minute.size]
    first = [int(r.minute.min()) for r in e2e.values() if r.minute.size]
    horizon = (max(used) + 1) * ROLLUP_UNIT_S if used else None
    if window_end is None:
        window_end = horizon if horizon is not None else time.time()
    if horizon is not None:
        horizon = min(horizon, window_end)
    end_minute = minute_of(window_end)
    start_minute = min(first) if first else end_minute
    excluded = {
        arm: warmup_minutes(
            e2e[arm],
            restart_times(engine_samples, arm),
            warmup_requests=stats_cfg.warmup_requests,
            restart_requests=scrape_cfg.warmup_requests,
            restart_seconds=scrape_cfg.warmup_seconds,
        )
        for arm in Arm
    }
    settings = CompareSettings.from_config(stats_cfg)
    rng = np.random.default_rng(stats_cfg.seed)
    per_window: dict[str, Any] = {}
    for window_s, label in windows:
        lo = (
            start_minute
            if window_s is None
            else max(minute_of(window_end - window_s), start_minute)
        )
        lo = min(lo, end_minute)
        arms: dict[str, dict[Arm, ArmBlocks]] = {}
        n_excluded: dict[str, int] = {}
        for metric in ROLLUP_METRICS:
            arms[metric] = {}
            for arm in Arm:
                blocks, dropped = _window_blocks(
                    rollups[metric][arm], lo, end_minute, excluded[arm]
                )
                arms[metric][arm] = blocks
                if metric == "e2e":
                    n_excluded[arm.value] = dropped
        since = lo * ROLLUP_UNIT_S
        engine = summarise_arms(engine_samples, gpu_samples, since=since)
        result = compare_rollup_window(arms, engine=engine, settings=settings, rng=rng)
        per_window[label] = {
            "window_s": window_s,
            "minutes": [lo, end_minute],
            **result,
            "excluded_warmup": n_excluded,
        }
    return RollupResults({"all": per_window}, window_end, horizon)
