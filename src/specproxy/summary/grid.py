"""The one fixed log-spaced grid that every mergeable histogram (raw rows or rollups) bins into.

The Poisson histogram path in `bootstrap.py` anchors its bins at the sample minimum, which makes
two histograms built on different data incomparable. Rollups written by different replicas in
different minutes must add bin by bin, so here bin i is the fixed interval

    [exp(i * d), exp((i + 1) * d)),  d = log1p(HISTOGRAM_REL_WIDTH)  (0.02 % wide)

with the same width as the Poisson path (`bootstrap.HISTOGRAM_REL_WIDTH` is this constant), so
the documented bound carries over unchanged: a
quantile replicate taken as a bin's geometric centre is within exp(+-d/2) of the order statistic
it stands for, and a ratio of two arms within exp(+-d), i.e. `GRID_ERROR_BOUND` (0.02 %).
A leaf module: the store (rollups) and the statistics share it.
The compacted rollup tier (`rollupblob.py`) keeps histograms on a coarse grid whose bin c is
fine bins [c * COARSE_FACTOR, (c + 1) * COARSE_FACTOR) (0.5 % wide). A coarse bin is represented
by the fine bin at its centre (`coarse_as_fine`; COARSE_FACTOR is odd, so that fine bin's centre
is the coarse bin's geometric centre), so coarse and fine entries mix in one histogram. Each value
then moves by at most exp(+-COARSE_FACTOR * d / 2), every order statistic by no more (a monotone
perturbation bound), and a ratio of two arms by at most exp(+-COARSE_FACTOR * d):
`COARSE_ERROR_BOUND` (0.5 %).
Bin indices are signed (latencies below 1 s have negative indices) and fit in int32 for any
latency between 1e-100 s and 1e100 s.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "COARSE_ERROR_BOUND",
    "COARSE_FACTOR",
    "GRID_ERROR_BOUND",
    "GRID_LOG_WIDTH",
    "GRID_REL_WIDTH",
    "bin_centres",
    "bin_index",
    "bin_log_centres",
    "bin_lower_edges",
    "coarse_as_fine",
    "coarse_bin",
    "grid_histogram",
]

GRID_REL_WIDTH: Final = 2e-4  # bins are 0.02 % wide, well below a P50 CI at n = 1M
GRID_LOG_WIDTH: Final = math.log1p(GRID_REL_WIDTH)
# worst-case relative error of a CI bound of a quantile ratio computed from grid bins: exp(d) - 1
GRID_ERROR_BOUND: Final = math.expm1(GRID_LOG_WIDTH)
COARSE_FACTOR: Final = 25  # fine bins per coarse bin (odd: see the module docstring)
COARSE_ERROR_BOUND: Final = math.expm1(COARSE_FACTOR * GRID_LOG_WIDTH)  # 0.5 %


def bin_index(values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Grid bin of each strictly positive value (raises on zero, negative or non-finite)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size and not bool(np.all(np.isfinite(v) & (v > 0))):
        raise ValueError("the log grid needs strictly positive finite values")
    return np.floor(np.log(v) / GRID_LOG_WIDTH).astype(np.int64)


def grid_histogram(
    values: npt.NDArray[np.float64],
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(sorted bins, counts) of strictly positive values on the grid."""
    bins, counts = np.unique(bin_index(values), return_counts=True)
    return bins.astype(np.int64), counts.astype(np.int64)


def bin_log_centres(bins: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Log of each bin's geometric centre."""
    return (np.asarray(bins, dtype=np.float64) + 0.5) * GRID_LOG_WIDTH


def bin_centres(bins: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Geometric centre of each bin."""
    return np.exp(bin_log_centres(bins))


def bin_lower_edges(bins: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """Lower edge of each bin."""
    return np.exp(np.asarray(bins, dtype=np.float64) * GRID_LOG_WIDTH)


def coarse_bin(fine: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Coarse bin of each fine bin (floor division: negative bins too)."""
    return np.floor_divide(np.asarray(fine, dtype=np.int64), COARSE_FACTOR)


def coarse_as_fine(coarse: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The fine bin at the centre of each coarse bin (what stands for the coarse bin's values)."""
    return np.asarray(coarse, dtype=np.int64) * COARSE_FACTOR + COARSE_FACTOR // 2
