"""How long after its minute a request of a ramp step may still land in the store, from the
arms' timeouts: pure and numpy-free, so `stats.job.settings`, which `specproxy serve` imports,
can work it out without loading the statistics (`stats.job.ramp` uses it)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Final

from specproxy.config import TimeoutConfig

__all__ = ["DEFAULT_HORIZON_S", "HORIZON_MAX_S", "horizon_s"]

# The most a guard keeps a minute open to requests still landing in it: at 1k req/s per arm a
# minute's histograms hold ~12k entries per arm, so 2 h is ~50 MB (streams without a cap).
HORIZON_MAX_S: Final = 7200.0
DEFAULT_HORIZON_S: Final = TimeoutConfig().longest_s() or HORIZON_MAX_S  # the default timeouts'


def horizon_s(longest: Iterable[float | None]) -> float:
    """How long after its minute ends a request of a step may still land, from the longest
    request of each compared arm (`TimeoutConfig.longest_s`; None: no cap), capped by
    `HORIZON_MAX_S`."""
    return min(HORIZON_MAX_S, max((x if x is not None else math.inf for x in longest), default=0))
