"""Verdicts that change only when evidence crosses a bound: the running intersection of CSs.

Rule: on the whole-run window ("all"), each tick's anytime-valid bounds (P99 and median ratio,
`sequential.py`) are intersected with every earlier tick's of the same job, per model and metric,
and the verdict flags are recomputed from the intersection. Why this is valid: a confidence
sequence holds at all times simultaneously with probability >= 1 - alpha, so the true ratio lies
in the intersection of all of them with the same probability (Howard, Ramdas, McAuliffe & Sekhon
2021, Sec. 2). Why it is hysteresis: the intersected lower bound can only rise and the upper bound
only fall, so once "slower" (lower P99 bound > 1 + tolerance) or "faster" is reached it stays,
and noise between ticks cannot flip it back. A verdict can change again only if the intersection
becomes empty, which under the model happens with probability <= alpha; then the memory restarts
from the current tick and the result says so (`hysteresis: "reset"`).

Sliding windows (5m, 1h) are not one growing sequence, so their verdicts are per tick and are
left as computed. The memory lives in the job that computes (the leader) and starts empty.
"""

from __future__ import annotations

import math
from typing import Final

from specproxy.stats.result import Sequential, StatsResult

__all__ = ["WHOLE_RUN", "VerdictMemory"]

WHOLE_RUN: Final = "all"  # `job.window_label(None)`
_Bounds = tuple[float, float, float, float]  # p99 lo, p99 hi, median lo, median hi


def _lo(x: float | None) -> float:
    return -math.inf if x is None else x


def _hi(x: float | None) -> float:
    return math.inf if x is None else x


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


class VerdictMemory:
    """Running intersection of the whole-run anytime-valid bounds, per (model, metric)."""

    def __init__(self) -> None:
        self._bounds: dict[tuple[str, str], _Bounds] = {}
        self._ticks: dict[tuple[str, str], int] = {}

    def apply(self, result: StatsResult, *, tolerance: float) -> None:
        """Intersect `result`'s whole-run bounds with the memory and rewrite its verdicts."""
        for model, windows in result["results"].items():
            res = windows.get(WHOLE_RUN)
            if res is None:
                continue
            for metric, block in res["metrics"].items():
                seq = block["sequential"]
                if seq is None:
                    continue
                key = (model, metric)
                now: _Bounds = (
                    _lo(seq["p99_ratio_lower"]),
                    _hi(seq["p99_ratio_upper"]),
                    _lo(seq["median_ratio_lower"]),
                    _hi(seq["median_ratio_upper"]),
                )
                prev = self._bounds.get(key)
                state = "first"
                if prev is not None:
                    merged: _Bounds = (
                        max(prev[0], now[0]),
                        min(prev[1], now[1]),
                        max(prev[2], now[2]),
                        min(prev[3], now[3]),
                    )
                    if merged[0] > merged[1] or merged[2] > merged[3]:
                        merged, state = now, "reset"
                        self._ticks[key] = 0
                    else:
                        state = "intersected"
                else:
                    merged = now
                self._bounds[key] = merged
                self._ticks[key] = self._ticks.get(key, 0) + 1
                _rewrite(seq, merged, tolerance, state, self._ticks[key])
                block["verdict"] = seq["verdict"]


def _rewrite(seq: Sequential, b: _Bounds, tolerance: float, state: str, ticks: int) -> None:
    seq["p99_ratio_lower"] = _finite(b[0]) if b[0] > 0 else 0.0
    seq["p99_ratio_upper"] = _finite(b[1])
    seq["median_ratio_lower"] = _finite(b[2]) if b[2] > 0 else 0.0
    seq["median_ratio_upper"] = _finite(b[3])
    seq["p99_slower"] = b[0] > 1.0 + tolerance
    seq["median_faster"] = b[3] < 1.0
    seq["median_slower"] = b[2] > 1.0
    if seq["p99_slower"] or seq["median_slower"]:
        seq["verdict"] = "slower"
    elif seq["median_faster"]:
        seq["verdict"] = "faster"
    else:
        seq["verdict"] = "inconclusive"
    seq["hysteresis"] = state
    seq["hysteresis_ticks"] = ticks
