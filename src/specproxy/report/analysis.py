"""Pure computations behind the report's figures (numpy only, no I/O, no plotting).

The headline numbers (speedups, CIs, verdicts) are never recomputed here: they come from the stats
job's result, so the report and GET /api/stats cannot disagree. What is computed here is what the
stats job does not publish: the load each request met, the speedup per load bin, and acceptance
per draft position averaged over the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specproxy.records import EngineSample

__all__ = [
    "LoadBin",
    "in_flight_at_start",
    "load_at",
    "mean_position_acceptance",
    "speedup_by_load",
]

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class LoadBin:
    """Median-E2E speedup among requests that met a similar load."""

    load: float  # mean load of the bin's requests
    estimate: float
    lower: float
    upper: float
    n_speculative: int
    n_baseline: int


def in_flight_at_start(t_start: FloatArray, e2e_s: FloatArray) -> FloatArray:
    """For each request, how many requests (itself included) were in flight when it started."""
    starts = np.sort(t_start)
    ends = np.sort(t_start + e2e_s)
    started = np.searchsorted(starts, t_start, side="right")
    finished = np.searchsorted(ends, t_start, side="right")
    return (started - finished).astype(np.float64)


def load_at(t: FloatArray, samples: Sequence[EngineSample]) -> FloatArray:
    """Requests running at each time: the mean over arms of each arm's last scrape before `t`.

    NaN where no arm had been scraped yet (or no scrape reported `requests_running`).
    """
    per_arm: list[FloatArray] = []
    for arm in sorted({s.arm for s in samples}):
        points = sorted(
            (s.t, s.requests_running)
            for s in samples
            if s.arm == arm and s.up and s.requests_running is not None
        )
        if not points:
            continue
        times = np.array([p[0] for p in points])
        values = np.array([p[1] for p in points], dtype=np.float64)
        idx = np.searchsorted(times, t, side="right") - 1
        per_arm.append(np.where(idx >= 0, values[np.clip(idx, 0, None)], np.nan))
    if not per_arm:
        return np.full(np.shape(t), np.nan)
    stacked = np.vstack(per_arm)
    counts = np.sum(np.isfinite(stacked), axis=0)
    sums = np.nansum(stacked, axis=0)
    return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def speedup_by_load(
    spec_load: FloatArray,
    spec_e2e: FloatArray,
    base_load: FloatArray,
    base_e2e: FloatArray,
    *,
    bins: int = 5,
    resamples: int = 1000,
    confidence: float = 0.95,
    min_per_arm: int = 10,
    rng: np.random.Generator,
) -> list[LoadBin]:
    """Median(baseline) / median(speculative) per load quantile bin, percentile-bootstrap CI.

    Bins are quantiles of the pooled load, so each holds about the same number of requests; bins
    with fewer than `min_per_arm` requests of either arm are left out rather than drawn noisy.
    """
    ok_s = np.isfinite(spec_load) & np.isfinite(spec_e2e)
    ok_b = np.isfinite(base_load) & np.isfinite(base_e2e)
    spec_load, spec_e2e = spec_load[ok_s], spec_e2e[ok_s]
    base_load, base_e2e = base_load[ok_b], base_e2e[ok_b]
    pooled = np.concatenate([spec_load, base_load])
    if pooled.size == 0:
        return []
    edges = np.unique(np.quantile(pooled, np.linspace(0, 1, bins + 1)))
    if edges.size < 2:
        edges = np.array([pooled.min(), pooled.max()])
    tail = (1 - confidence) / 2
    out: list[LoadBin] = []
    for i in range(edges.size - 1):
        lo, hi = edges[i], edges[i + 1]
        last = i == edges.size - 2
        in_s = (spec_load >= lo) & ((spec_load <= hi) if last else (spec_load < hi))
        in_b = (base_load >= lo) & ((base_load <= hi) if last else (base_load < hi))
        s, b = spec_e2e[in_s], base_e2e[in_b]
        if s.size < min_per_arm or b.size < min_per_arm:
            continue
        boot_s = np.median(rng.choice(s, size=(resamples, s.size)), axis=1)
        boot_b = np.median(rng.choice(b, size=(resamples, b.size)), axis=1)
        ratios = boot_b / boot_s
        out.append(
            LoadBin(
                load=float(np.mean(np.concatenate([spec_load[in_s], base_load[in_b]]))),
                estimate=float(np.median(b) / np.median(s)),
                lower=float(np.quantile(ratios, tail)),
                upper=float(np.quantile(ratios, 1 - tail)),
                n_speculative=int(s.size),
                n_baseline=int(b.size),
            )
        )
    return out


def mean_position_acceptance(
    samples: Sequence[EngineSample], arm: str = "speculative"
) -> tuple[float, ...]:
    """Per-position acceptance averaged over one arm's scrapes that reported it (by default the
    two-arm shorthand's treatment)."""
    rows = [
        s.position_acceptance for s in samples if s.arm == arm and s.position_acceptance is not None
    ]
    if not rows:
        return ()
    width = max(len(r) for r in rows)
    table = np.full((len(rows), width), np.nan)
    for i, row in enumerate(rows):
        table[i, : len(row)] = row
    return tuple(float(v) for v in np.nanmean(table, axis=0))
