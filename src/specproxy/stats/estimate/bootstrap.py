"""The bootstrap's shared parts: `Interval`, percentile bounds, and the paired design's engine.

Percentile intervals of the ratio, because for latency quantiles BCa's jackknife acceleration is
unreliable and the basic interval under-covers (`/work/shared/notes/ab_stats.md`). Split traffic
is resampled from the histograms (`blockboot`); mirrored pairs are the one design resampled per
request: one multinomial resample of pair indices applied to both arms, quantiles read from the
resample counts in each arm's sorted order, numpy's linear quantile on each replicate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from specproxy.stats import result as schema
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS

__all__ = [
    "DEFAULT_RESAMPLES",
    "Interval",
    "paired_replicates",
    "paired_speedup_intervals",
    "percentile_interval",
]

FloatArray = npt.NDArray[np.float64]

DEFAULT_RESAMPLES: Final = 2000
_CHUNK_ELEMENTS: Final = 4_000_000  # cap on a (resamples x n) work array per chunk


@dataclass(frozen=True, slots=True)
class Interval:
    """A point estimate with its confidence bounds."""

    estimate: float
    lower: float
    upper: float

    def to_dict(self) -> schema.Interval:
        return {
            "estimate": _finite(self.estimate),
            "lower": _finite(self.lower),
            "upper": _finite(self.upper),
        }


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


def percentile_interval(replicates: FloatArray, confidence: float) -> tuple[float, float]:
    """Equal-tailed percentile bounds of bootstrap replicates (NaN replicates ignored)."""
    finite = replicates[np.isfinite(replicates)]
    if finite.size == 0:
        return math.nan, math.nan
    tail = (1.0 - confidence) / 2.0
    lo, hi = np.quantile(finite, [tail, 1.0 - tail])
    return float(lo), float(hi)


def _chunks(resamples: int, n: int) -> list[int]:
    per = max(1, _CHUNK_ELEMENTS // max(n, 1))
    sizes = [per] * (resamples // per)
    if resamples % per:
        sizes.append(resamples % per)
    return sizes


def paired_replicates(
    baseline: FloatArray,
    speculative: FloatArray,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int,
) -> dict[str, tuple[FloatArray, FloatArray]]:
    """Replicates of each statistic for both arms under one shared resample of the pairs."""
    n = baseline.size
    order_b, order_s = np.argsort(baseline), np.argsort(speculative)
    sorted_b, sorted_s = baseline[order_b], speculative[order_s]
    parts: dict[str, tuple[list[FloatArray], list[FloatArray]]] = {s: ([], []) for s in statistics}
    for size in _chunks(resamples, n):
        idx = rng.integers(0, n, size=(size, n))
        offsets = (np.arange(size) * n)[:, None]
        counts = np.bincount((idx + offsets).ravel(), minlength=size * n).reshape(size, n)
        for stat in statistics:
            b_list, s_list = parts[stat]
            if stat == "mean":
                b_list.append(counts @ baseline / n)
                s_list.append(counts @ speculative / n)
                continue
            p = QUANTILE_LEVELS[stat]
            b_list.append(_weighted_linear_quantile(counts[:, order_b], sorted_b, p))
            s_list.append(_weighted_linear_quantile(counts[:, order_s], sorted_s, p))
    return {s: (np.concatenate(b), np.concatenate(v)) for s, (b, v) in parts.items()}


def _weighted_linear_quantile(
    counts: npt.NDArray[np.int64], sorted_values: FloatArray, p: float
) -> FloatArray:
    """numpy's linear quantile of each resample given as counts over sorted values."""
    n = int(counts[0].sum())
    h = (n - 1) * p
    j = math.floor(h)
    frac = h - j
    cum = np.cumsum(counts, axis=1)
    i_low = (cum <= j).sum(axis=1)
    low: FloatArray = sorted_values[i_low]
    if frac == 0.0 or j + 1 >= n:
        return low
    i_high = (cum <= j + 1).sum(axis=1)
    high: FloatArray = sorted_values[i_high]
    return low + frac * (high - low)


def paired_speedup_intervals(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int = DEFAULT_RESAMPLES,
    confidence: float = 0.95,
) -> dict[str, Interval]:
    """Speedup CIs (bounds only; the estimate is the caller's, from the samples) for mirrored
    traffic: element i of both arrays is the same request (pair)."""
    if baseline.shape != speculative.shape:
        raise ValueError("paired arrays must have the same length")
    if baseline.size == 0:
        return {s: Interval(math.nan, math.nan, math.nan) for s in statistics}
    reps = paired_replicates(baseline, speculative, statistics, rng, resamples)
    out: dict[str, Interval] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for stat in statistics:
            b, s = reps[stat]
            out[stat] = Interval(math.nan, *percentile_interval(b / s, confidence))
    return out
