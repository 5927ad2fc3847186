"""Which records count: warm-up exclusion (the one rule the stats job and the report share) and
outlier flagging, per arm.

After a start or an engine restart the first requests pay for cold caches, CUDA graph capture and
JIT, so they say nothing about steady-state speed. Per arm, across models (the engine warms up,
not the model), `warmup_exclusion` drops the first `stats.warmup_requests` usable requests of the
run, and after every restart the scraper reported the first `scrape.warmup_requests` usable
requests plus every usable request starting within `scrape.warmup_seconds`. Only usable requests
(HTTP 200, no error, client connected) fill warm-up slots: the 502s an arm answers while it is
down never warmed anything, and counting them would let cold requests through.

A restart is dated by `restart_times`, as early as the evidence allows but never before the old
engine's last requests: vLLM's `process_start_time_seconds` can read up to ~1 s before the wall
clock, so when scrapes failed in between (the arm was down), the window cannot open before the
first failed scrape, since the new engine served nothing before a scrape that found the arm down.

Outliers are different: they are real latency that users saw, so they are only counted and
flagged (1.5 IQR fences on log latency, because latency is multiplicative), never removed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specproxy.config import ScrapeConfig, StatsConfig
from specproxy.records import Arm, EngineSample
from specproxy.scrape.derive import date_restart
from specproxy.stats import result as schema
from specproxy.summary.rows import ArmArrays

__all__ = [
    "OutlierSummary",
    "count_outliers",
    "restart_times",
    "usable_mask",
    "warmup_exclusion",
    "warmup_mask",
]

FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]


def restart_times(samples: Iterable[EngineSample], arm: Arm) -> list[float]:
    """When each restart of `arm` that its stored samples (time order) mark happened.

    After failed scrapes (up=False) since the last good sample: the new process start time, but
    not before the first failed scrape (nor after the sample that saw the restart). Otherwise:
    the new process start time when it lies between the previous sample and this one, else the
    previous sample's time (the earliest moment the restart can have happened).
    """
    times: list[float] = []
    previous: float | None = None  # time of the last good sample
    first_failed: float | None = None  # first failed scrape since then
    for sample in samples:
        if sample.arm is not arm:
            continue
        if not sample.up:
            if first_failed is None:
                first_failed = sample.t
            continue
        if sample.restarted:
            times.append(date_restart(sample.t, sample.process_start_time, previous, first_failed))
        previous, first_failed = sample.t, None
    return times


def usable_mask(arrays: ArmArrays) -> BoolArray:
    """Successful, complete requests: HTTP 200, no error kind, client still connected."""
    n = len(arrays["t_start"])
    ok = np.ones(n, dtype=bool)
    if "status" in arrays:
        ok &= np.asarray(arrays["status"], dtype=np.float64) == 200
    if "error_kind" in arrays:
        ok &= np.array([e is None for e in arrays["error_kind"]], dtype=bool)
    if "disconnected" in arrays:
        ok &= ~np.asarray(arrays["disconnected"], dtype=bool)
    return ok


def warmup_exclusion(
    arrays: ArmArrays,
    samples: Iterable[EngineSample],
    arm: Arm,
    *,
    stats_cfg: StatsConfig,
    scrape_cfg: ScrapeConfig,
) -> BoolArray:
    """The warm-up rule: True for each record of `arm` (its whole run, any order) to exclude.

    `arrays` needs `t_start` and the columns of `usable_mask`; `samples` are the run's
    engine samples (any arm, time order). Unusable records are never marked: they are dropped as
    failed, so "failed" and "warm-up" partition the records left out.
    """
    return warmup_mask(
        np.asarray(arrays["t_start"], dtype=np.float64),
        restart_times(samples, arm),
        usable=usable_mask(arrays),
        warmup_requests=stats_cfg.warmup_requests,
        restart_requests=scrape_cfg.warmup_requests,
        restart_seconds=scrape_cfg.warmup_seconds,
    )


def warmup_mask(
    t_start: FloatArray,
    restarts: Sequence[float],
    *,
    usable: BoolArray | None = None,
    warmup_requests: int,
    restart_requests: int | None = None,
    restart_seconds: float = 0.0,
) -> BoolArray:
    """The mechanics of `warmup_exclusion`, for given restart times; `t_start` in any order.

    Marks the first `warmup_requests` usable records, and after each restart time the first
    `restart_requests` (default: `warmup_requests`) usable records that started at or after it,
    plus every usable record that started within `restart_seconds` of it (the union of the two
    limits). `usable` defaults to every record.
    """
    t = np.asarray(t_start, dtype=np.float64)
    ok = np.ones(t.shape, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
    order = np.argsort(t, kind="stable")
    sorted_t = t[order]
    usable_at = np.flatnonzero(ok[order])  # positions, in start order, of the usable records
    sorted_mask = np.zeros(t.shape, dtype=bool)
    sorted_mask[usable_at[:warmup_requests]] = True
    per_restart = warmup_requests if restart_requests is None else restart_requests
    for restart in restarts:
        first = int(np.searchsorted(sorted_t, restart, side="left"))
        k = int(np.searchsorted(usable_at, first, side="left"))
        sorted_mask[usable_at[k : k + per_restart]] = True
        if restart_seconds > 0:
            last = int(np.searchsorted(sorted_t, restart + restart_seconds, side="left"))
            sorted_mask[usable_at[k : int(np.searchsorted(usable_at, last, side="left"))]] = True
    mask = np.zeros(t.shape, dtype=bool)
    mask[order] = sorted_mask
    return mask


@dataclass(frozen=True, slots=True)
class OutlierSummary:
    """Values outside the 1.5 IQR fences of log latency (fences reported in seconds)."""

    count: int
    fraction: float
    low_fence: float
    high_fence: float

    def to_dict(self) -> schema.Outliers:
        return {
            "count": self.count,
            "fraction": self.fraction,
            "low_fence": self.low_fence if math.isfinite(self.low_fence) else None,
            "high_fence": self.high_fence if math.isfinite(self.high_fence) else None,
        }


def count_outliers(values: FloatArray, factor: float = 1.5) -> OutlierSummary:
    """Count (never remove) values beyond Q1 - factor*IQR or Q3 + factor*IQR of log(values)."""
    if values.size < 4:
        return OutlierSummary(0, 0.0, math.nan, math.nan)
    logs = np.log(values)
    q1, q3 = np.quantile(logs, [0.25, 0.75])
    iqr = q3 - q1
    low, high = q1 - factor * iqr, q3 + factor * iqr
    count = int(np.sum((logs < low) | (logs > high)))
    return OutlierSummary(count, count / values.size, math.exp(low), math.exp(high))
