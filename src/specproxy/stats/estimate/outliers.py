"""Outliers of one arm: values beyond the 1.5-IQR fences of log latency, counted, never removed.

They are real latency users saw, so they are flagged only. Fences come from the histogram's
quartiles (log scale, latency being multiplicative); a bin straddling a fence counts by its centre.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specproxy.stats import result as schema
from specproxy.stats.sample import ArmSample
from specproxy.summary.histogram import bin_log_centres

__all__ = ["OutlierSummary", "count_outliers", "log_quantiles"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class OutlierSummary:
    """Values outside the fences (fences in seconds)."""

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


def log_quantiles(bins: IntArray, counts: IntArray, levels: list[float]) -> FloatArray:
    """Lower order statistics at ranks floor((n-1)p), as log bin centres (bins sorted)."""
    n = int(counts.sum())
    cum = np.cumsum(counts)
    ranks = np.floor((n - 1) * np.asarray(levels))
    return bin_log_centres(bins[np.searchsorted(cum, ranks, side="right")])


def count_outliers(sample: ArmSample, factor: float = 1.5) -> OutlierSummary:
    """Values beyond Q1 - factor*IQR or Q3 + factor*IQR of log values."""
    bins, counts = sample.pooled()
    n = int(counts.sum())
    if n < 4:
        return OutlierSummary(0, 0.0, math.nan, math.nan)
    q1, q3 = log_quantiles(bins, counts, [0.25, 0.75])
    iqr = float(q3 - q1)
    low, high = float(q1) - factor * iqr, float(q3) + factor * iqr
    logs = bin_log_centres(bins)
    count = int(counts[(logs < low) | (logs > high)].sum())
    return OutlierSummary(count, count / n, math.exp(low), math.exp(high))
