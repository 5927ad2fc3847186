"""The one fixed log-spaced grid that every mergeable histogram (raw rows or rollups) bins into.

Bin i is the fixed interval [exp(i * d), exp((i + 1) * d)), d = log1p(GRID_REL_WIDTH) (0.02 %
wide), whatever the data, so histograms written by different replicas in different minutes add
bin by bin. A bin's geometric centre is within exp(+-d/2) of every value in it, so a quantile
taken from bins is within `GRID_ERROR_BOUND` of the order statistic's ratio. The coarse grid of
the compacted tier groups `COARSE_FACTOR` (odd) fine bins: a coarse bin is represented by the
fine bin at its centre, so coarse and fine entries mix in one histogram within
`COARSE_ERROR_BOUND`. Bin indices are signed and fit in int32 for latencies in [1e-100, 1e100] s.

Pure Python (the store's write path bins with `bin_of`); the vectorised functions are in
`summary.histogram` and give the same bin for every value.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "COARSE_ERROR_BOUND",
    "COARSE_FACTOR",
    "GRID_ERROR_BOUND",
    "GRID_LOG_WIDTH",
    "GRID_REL_WIDTH",
    "bin_of",
    "coarse_centre_of",
]

GRID_REL_WIDTH: Final = 2e-4  # bins are 0.02 % wide, well below a P50 CI at n = 1M
GRID_LOG_WIDTH: Final = math.log1p(GRID_REL_WIDTH)
# worst-case relative error of a CI bound of a quantile ratio computed from grid bins: exp(d) - 1
GRID_ERROR_BOUND: Final = math.expm1(GRID_LOG_WIDTH)
COARSE_FACTOR: Final = 25  # fine bins per coarse bin (odd: see the module docstring)
COARSE_ERROR_BOUND: Final = math.expm1(COARSE_FACTOR * GRID_LOG_WIDTH)  # 0.5 %


def bin_of(value: float) -> int:
    """The grid bin of a strictly positive finite value (a ValueError otherwise): the definition
    `summary.histogram.bin_index` follows for arrays."""
    if not (value > 0 and math.isfinite(value)):
        raise ValueError("the log grid needs strictly positive finite values")
    return math.floor(math.log(value) / GRID_LOG_WIDTH)


def coarse_centre_of(value: float) -> int:
    """The fine bin at the centre of the coarse bin of a strictly positive finite value: what
    a compacted block enters it as (`summary.histogram.coarse_as_fine` of `coarse_bin`)."""
    return bin_of(value) // COARSE_FACTOR * COARSE_FACTOR + COARSE_FACTOR // 2
