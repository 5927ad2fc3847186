"""The statistics we compare (median, mean, P90, P99) and when a quantile can be trusted at all.

A latency quantile is only worth reporting when a distribution-free confidence interval for it
exists: with n samples, the widest order-statistic interval [x_(1), x_(n)] covers the p-quantile
with probability 1 - p**n - (1-p)**n. Asking each tail for at most (1 - confidence)/2 gives the
minimum n; for P99 at 95 % that is 368 per arm. Below it we say "insufficient", never a number.
"""

from __future__ import annotations

import math
from typing import Final

from specproxy.stats.result import STATISTIC_LEVELS, STATISTICS, Statistic

__all__ = [
    "QUANTILE_LEVELS",
    "STATISTICS",
    "Statistic",
    "min_samples_for_quantile_ci",
    "samples_needed",
]

# STATISTICS and Statistic are declared in `stats.result` (the one list) and re-exported here.
QUANTILE_LEVELS: Final[dict[str, float]] = {
    name: level for name, level in STATISTIC_LEVELS.items() if level is not None
}


def min_samples_for_quantile_ci(p: float, confidence: float) -> int:
    """Smallest n for which an equal-tailed distribution-free CI of the p-quantile exists."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {p}")
    tail = (1.0 - confidence) / 2.0
    return math.ceil(math.log(tail) / math.log(max(p, 1.0 - p)))


def samples_needed(statistic: str, n: int, confidence: float) -> int:
    """How many more samples an arm needs before `statistic` may be reported (0 = enough)."""
    if statistic == "mean":
        return max(0, 2 - n)
    return max(0, min_samples_for_quantile_ci(QUANTILE_LEVELS[statistic], confidence) - n)
