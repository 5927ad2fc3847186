"""Warm-up: the time units each arm leaves out after its start and after every engine restart.

After a start or a restart the first requests pay for cold caches, CUDA graph capture and JIT.
Per arm, across models (the engine warms up, not the model), the units holding its first
`requests` usable requests are left out, and after each restart the units from the restart's on,
until both `restart_requests` requests and `restart_seconds` have passed. Whole units, because a
histogram cannot be split: with minute units that leaves out at most a minute more than a
per-request rule would. A restart is dated as early as the evidence allows but never before the
old engine's last good scrape (`restart_times`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm, EngineSample
from specproxy.scrape.derive import date_restart

__all__ = ["WarmupRule", "excluded_units", "restart_times"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class WarmupRule:
    """The one warm-up table (`[warmup]`)."""

    requests: int = 20  # usable requests per arm left out after the start of the run
    restart_requests: int = 20  # ... and after each engine restart
    restart_seconds: float = 30.0  # ... and every request within this long of a restart


def restart_times(samples: Iterable[EngineSample], arm: Arm) -> list[float]:
    """When each restart of `arm` that its stored samples (time order) mark happened.

    After failed scrapes since the last good sample: the new process start time, but not before
    the first failed scrape. Otherwise the new start time when it lies between the previous sample
    and this one, else the previous sample's time (the earliest the restart can have happened).
    """
    times: list[float] = []
    previous: float | None = None  # time of the last good sample
    first_failed: float | None = None  # first failed scrape since then
    for sample in samples:
        if sample.arm != arm:
            continue
        if not sample.up:
            if first_failed is None:
                first_failed = sample.t
            continue
        if sample.restarted:
            times.append(date_restart(sample.t, sample.process_start_time, previous, first_failed))
        previous, first_failed = sample.t, None
    return times


def excluded_units(
    unit: IntArray,
    n_per_unit: IntArray,
    restarts: Sequence[float],
    *,
    unit_s: float,
    rule: WarmupRule,
) -> set[int]:
    """Absolute units (floor(t / unit_s)) of one arm left out as warm-up, from the usable request
    count of each unit holding any (a unit may repeat: its counts are summed)."""
    if unit.size == 0:
        return set()
    units, inverse = np.unique(unit, return_inverse=True)
    n = np.bincount(inverse, weights=n_per_unit)
    before = np.concatenate([[0.0], np.cumsum(n)[:-1]])
    out = set(units[before < rule.requests].tolist())
    for restart in restarts:
        first = math.floor(restart / unit_s)
        last_by_time = math.floor((restart + rule.restart_seconds) / unit_s)
        after = units >= first
        counted = np.cumsum(np.where(after, n, 0.0)) - np.where(after, n, 0.0)
        by_count = units[after & (counted < rule.restart_requests)]
        last = max(last_by_time, int(by_count.max()) if by_count.size else first)
        out.update(range(first, last + 1))
    return out
