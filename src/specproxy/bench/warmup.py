"""When is a server warm? A pure rule over the latencies seen so far.

The first requests to a fresh engine pay for lazy initialisation (CUDA graphs, caches, the
allocator); timing them would bias the comparison against whichever arm started last. Raw E2E
varies with prompt and output length, so the rule watches latency per output token: warm-up ends
when the medians of the last two windows of `window` requests differ by less than `tolerance`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["is_stable", "per_token_latency"]


def per_token_latency(e2e_s: float, output_tokens: int | None) -> float:
    """E2E divided by the output length (1 when unknown), so long answers do not look slow."""
    return e2e_s / max(1, output_tokens or 1)


def is_stable(values: Sequence[float], *, window: int = 10, tolerance: float = 0.1) -> bool:
    """True when the last two windows' medians are within `tolerance` of each other."""
    if window < 1:
        raise ValueError("window must be >= 1")
    if len(values) < 2 * window:
        return False
    recent = float(np.median(values[-window:]))
    before = float(np.median(values[-2 * window : -window]))
    if before <= 0:
        return recent <= 0
    return abs(recent - before) / before < tolerance
