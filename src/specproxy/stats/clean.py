"""Warm-up exclusion and outlier flagging, per arm.

After a start or an engine restart the first requests pay for cold caches, CUDA graph capture and
JIT, so they say nothing about steady-state speed: the first W requests of each arm after the run
start and after every restart (and, optionally, those within a few seconds of a restart) are
excluded. Outliers are different: they are real latency that users saw, so they are only counted
and flagged (1.5 IQR fences on log latency, because latency is multiplicative), never removed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["OutlierSummary", "count_outliers", "warmup_mask"]

FloatArray = npt.NDArray[np.float64]


def warmup_mask(
    t_start: FloatArray,
    restart_times: Sequence[float],
    *,
    warmup_requests: int,
    restart_requests: int | None = None,
    restart_seconds: float = 0.0,
) -> npt.NDArray[np.bool_]:
    """True for the records to exclude; `t_start` must cover the arm's whole run in time order.

    The first `warmup_requests` records are excluded, and after each restart time the first
    `restart_requests` (default: `warmup_requests`) records that started at or after it, plus any
    record that started within `restart_seconds` of it.
    """
    n = t_start.size
    excluded = np.zeros(n, dtype=bool)
    excluded[: min(warmup_requests, n)] = True
    per_restart = warmup_requests if restart_requests is None else restart_requests
    for restart in restart_times:
        first = int(np.searchsorted(t_start, restart, side="left"))
        excluded[first : first + per_restart] = True
        if restart_seconds > 0:
            last = int(np.searchsorted(t_start, restart + restart_seconds, side="left"))
            excluded[first:last] = True
    return excluded


@dataclass(frozen=True, slots=True)
class OutlierSummary:
    """Values outside the 1.5 IQR fences of log latency (fences reported in seconds)."""

    count: int
    fraction: float
    low_fence: float
    high_fence: float

    def to_dict(self) -> dict[str, float | int | None]:
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
