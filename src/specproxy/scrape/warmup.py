"""Which requests fall in an engine's warm-up window after a restart (pure, for the stats job).

A freshly restarted engine is cold (empty prefix cache, lazy compilation, CUDA graph capture), so
its first requests say nothing about steady-state speed. After each restart of an arm, that
arm's requests are excluded while *either* limit still holds: the first `warmup_requests`
requests after the restart, and every request starting within `warmup_seconds` of it. Taking the
union errs on the side of excluding a few steady-state requests rather than keeping cold ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from specproxy.records import EngineSample

__all__ = ["restart_times_from_samples", "warmup_mask"]


def restart_times_from_samples(samples: Iterable[EngineSample]) -> list[float]:
    """Restart times of one arm from its stored samples (time order).

    A restarted sample's window opens at the new process start time when that lies between the
    previous sample and this one, else at the previous sample's time (the earliest possible
    moment), matching `derive.restart_time`.
    """
    times: list[float] = []
    prev_t: float | None = None
    for sample in samples:
        if sample.restarted:
            start = sample.process_start_time
            low = prev_t if prev_t is not None else float("-inf")
            if start is not None and low <= start <= sample.t:
                times.append(start)
            else:
                times.append(prev_t if prev_t is not None else sample.t)
        prev_t = sample.t
    return times


def warmup_mask(
    t_start: npt.NDArray[np.float64],
    restart_times: Sequence[float],
    *,
    warmup_requests: int,
    warmup_seconds: float,
) -> npt.NDArray[np.bool_]:
    """True for each request (of one arm, any order) that falls in a warm-up window."""
    t = np.asarray(t_start, dtype=np.float64)
    mask = np.zeros(t.shape, dtype=np.bool_)
    if not restart_times or t.size == 0:
        return mask
    order = np.argsort(t, kind="stable")
    sorted_t = t[order]
    for restart in restart_times:
        first = int(np.searchsorted(sorted_t, restart, side="left"))
        by_time = int(np.searchsorted(sorted_t, restart + warmup_seconds, side="right"))
        end = max(by_time, min(first + warmup_requests, sorted_t.size))
        mask[order[first:end]] = True
    return mask
