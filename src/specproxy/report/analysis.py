"""Pure computations behind the report's figures (numpy only, no I/O, no plotting).

The headline numbers (speedups, CIs, verdicts, the speedups by load band) are never recomputed
here: they come from the stats job's result, so the report and GET /api/stats cannot disagree.
What is computed here is what the stats job does not publish: acceptance per draft position
averaged over the run.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from specproxy.records import EngineSample

__all__ = ["mean_position_acceptance"]

FloatArray = npt.NDArray[np.float64]


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
