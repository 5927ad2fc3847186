"""The log grid of `summary.grid` for arrays: bins, histograms, centres and the coarse grid.

`bin_index` gives exactly the bins of `grid.bin_of` (the store bins its rollups with the scalar
one, the statistics their rows with this one, and both must agree): numpy's vectorised `log` may
differ from `math.log` in the last bit, which moves a value only when it lies within rounding of
a bin edge, so values that close to an edge are binned again with `bin_of`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specproxy.summary.grid import COARSE_FACTOR, GRID_LOG_WIDTH, bin_of

__all__ = [
    "bin_centres",
    "bin_index",
    "bin_log_centres",
    "bin_lower_edges",
    "coarse_as_fine",
    "coarse_bin",
    "grid_histogram",
]

# |log(v) / d - nearest integer| below this: the value is re-binned with `bin_of`. A last-bit
# difference of log(v) moves log(v) / d by < 1e-9 for any v in [1e-100, 1e100].
_EDGE_SLACK = 1e-6


def bin_index(values: npt.NDArray[np.float64]) -> npt.NDArray[np.int64]:
    """Grid bin of each strictly positive value (raises on zero, negative or non-finite)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size and not bool(np.all(np.isfinite(v) & (v > 0))):
        raise ValueError("the log grid needs strictly positive finite values")
    x = np.log(v) / GRID_LOG_WIDTH
    bins = np.floor(x).astype(np.int64)
    near = np.flatnonzero(np.abs(x - np.rint(x)) < _EDGE_SLACK)
    if near.size:
        flat = v.reshape(-1)
        bins.reshape(-1)[near] = [bin_of(float(flat[i])) for i in near.tolist()]
    return bins


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
