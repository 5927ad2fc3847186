"""Is an arm overloaded? Its latency medians over the first and the last third of a window (pure).

An open-loop load (arrivals that do not wait for answers, as real traffic and the demo's Poisson
load) above what an arm serves grows that arm's queue for as long as it lasts, and every
request waits longer than the one before: latency rises steadily with time. Below capacity the
queue stays short and latency is stationary. So the detector splits the window's time span (the
span its requests cover) in thirds and takes, per arm, the median TTFT and the median TPOT of
each third's requests: a median that rises from third to third (by `QUEUE_STEP` at least), the
last at least `stats.diagnosis.QUEUE_GROWTH` times the first, each third holding at least
`QUEUE_MIN_REQUESTS` requests, is queueing. The middle third must rise too, so that a burst of
contention at one end of the window (another process taking the CPU for a while) is not mistaken
for a queue that grows. TTFT carries the wait of a request queued in front of the engine (vLLM's
waiting requests); TPOT the slower steps of a batch that keeps growing (the emulator admits up
to 256 sequences, so its queue is the batch). Both are per-request rates, unlike E2E they do
not depend on how long the answers are, so a stationary mix of lengths keeps them flat.
Warm-up is excluded from the samples already, and it would make latency fall, not rise.

The engine's scraped waiting requests would say the same for vLLM, but the stores keep only
hourly means of a few engine fields, not that one (`summary.engine.MEAN_FIELDS`), and the
emulator, like vLLM below `max_num_seqs`, queues in the batch, where nothing waits.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from specproxy.stats.diagnosis import QUEUE_GROWTH, QUEUE_MIN_REQUESTS, LatencyGrowth
from specproxy.stats.sample import ArmSample, ArmWindow
from specproxy.summary.histogram import bin_centres

__all__ = ["QUEUE_METRICS", "QUEUE_STEP", "latency_growth", "thirds_medians"]

QUEUE_METRICS: tuple[tuple[str, str], ...] = (("ttft", "TTFT"), ("tpot", "TPOT"))
QUEUE_STEP = 1.1  # each third's median over the one before, at least


def latency_growth(arms: Mapping[str, ArmWindow]) -> tuple[LatencyGrowth, ...]:
    """Every (arm, metric) whose median rose by `QUEUE_GROWTH` or more within the window."""
    out: list[LatencyGrowth] = []
    for arm, window in arms.items():
        for metric, label in QUEUE_METRICS:
            medians = thirds_medians(window.sample(metric))
            if medians is None:
                continue
            early, middle, late = medians
            rises = middle >= QUEUE_STEP * early and late >= QUEUE_STEP * middle
            if early > 0.0 and rises and late >= QUEUE_GROWTH * early:
                out.append(LatencyGrowth(arm, label, early, late))
    return tuple(out)


def thirds_medians(sample: ArmSample) -> tuple[float, float, float] | None:
    """The medians of the first, middle and last third of the time units holding values, each
    a bin centre; None when the values span fewer than 3 units or a third holds fewer than
    `QUEUE_MIN_REQUESTS` values."""
    occupied = np.flatnonzero(sample.unit_n)
    if occupied.size < 3:
        return None
    first, last = int(occupied[0]), int(occupied[-1])
    third = (last - first + 1) / 3.0
    early = _median(sample, sample.unit < first + third)
    late = _median(sample, sample.unit >= last + 1 - third)
    middle = _median(sample, (sample.unit >= first + third) & (sample.unit < last + 1 - third))
    if early is None or middle is None or late is None:
        return None
    return early, middle, late


def _median(sample: ArmSample, mask: npt.NDArray[np.bool_]) -> float | None:
    """The lower median of the entries under `mask`, as its bin's geometric centre."""
    bins, counts = sample.bins[mask], sample.counts[mask]
    n = int(counts.sum())
    if n < QUEUE_MIN_REQUESTS:
        return None
    order = np.argsort(bins, kind="stable")
    cum = np.cumsum(counts[order])
    at = int(np.searchsorted(cum, (n + 1) // 2, side="left"))
    return float(bin_centres(bins[order][at : at + 1])[0])
