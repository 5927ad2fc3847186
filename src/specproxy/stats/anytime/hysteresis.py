"""Verdicts that change only when evidence crosses a bound: intersected CSs, sticky crossings.

Rule: on the whole-run window ("all"), per model and metric, the job remembers
  * the running intersection of every tick's anytime-valid ratio bounds (P99 and median,
    `sequential.py`), and
  * whether each direction of the two-sample P99 e-process (`p99test.py`) and of the per-minute
    exceedance e-process (`exceedance.py`) has ever crossed its boundary;
and each tick re-decides the verdict with `sequential.decide` from the intersected bounds and the
remembered crossings (`verdict.write_decision`).

Why this is valid: a confidence sequence holds at all times simultaneously with probability
>= 1 - alpha, so the true ratio lies in the intersection of all of them with the same probability
(Howard, Ramdas, McAuliffe & Sekhon 2021, Sec. 2); an e-process crosses 1/alpha at ANY time with
probability <= alpha (Ville), so stopping at its first crossing and keeping the rejection is a
valid test, although the statistic (a minimum over quantiles of a product of mixtures) may fall
back below the boundary later.

Why it is hysteresis: the intersected lower bound can only rise and the upper bound only fall,
and a crossing is never forgotten, so once "slower" or "faster" is reached it stays, and noise
between ticks cannot flip it back. A verdict can change again only when the memory contradicts
itself: the intersection becomes empty, or the P99 evidence points both ways (a remembered or
new slower rejection beside a faster one). Under the model that needs an error of a test
(probability <= alpha); the memory then restarts from the current tick and the result says so
(`hysteresis: "reset"`).

Sliding windows (5m, 1h) are not one growing sequence, so their verdicts are per tick and are
left as computed. The memory lives in the job that computes (the leader) and starts empty.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from specproxy.stats.anytime.sequential import Decision, decide
from specproxy.stats.anytime.verdict import write_decision
from specproxy.stats.result import Sequential, StatsResult

__all__ = ["WHOLE_RUN", "VerdictMemory"]

WHOLE_RUN: Final = "all"  # `job.window_label(None)`


@dataclass(frozen=True, slots=True)
class _Memory:
    """What one (model, metric) remembers of the whole run."""

    p99_lower: float
    p99_upper: float
    median_lower: float
    median_upper: float
    crossed_slower: bool  # the two-sample e-process, slower direction, ever crossed
    crossed_faster: bool
    exceeded_slower: bool = False  # the exceedance e-process, slower direction, ever crossed
    exceeded_faster: bool = False

    def decision(self, tolerance: float) -> Decision:
        return decide(
            self.p99_lower,
            self.p99_upper,
            self.median_lower,
            self.median_upper,
            tolerance=tolerance,
            two_sample_slower=self.crossed_slower,
            two_sample_faster=self.crossed_faster,
            exceedance_slower=self.exceeded_slower,
            exceedance_faster=self.exceeded_faster,
        )

    def merged(self, now: _Memory) -> _Memory:
        return _Memory(
            max(self.p99_lower, now.p99_lower),
            min(self.p99_upper, now.p99_upper),
            max(self.median_lower, now.median_lower),
            min(self.median_upper, now.median_upper),
            self.crossed_slower or now.crossed_slower,
            self.crossed_faster or now.crossed_faster,
            self.exceeded_slower or now.exceeded_slower,
            self.exceeded_faster or now.exceeded_faster,
        )

    def contradicts_itself(self, tolerance: float) -> bool:
        empty = self.p99_lower > self.p99_upper or self.median_lower > self.median_upper
        return empty or self.decision(tolerance).p99_conflict


def _lo(x: float | None) -> float:
    return -math.inf if x is None else x


def _hi(x: float | None) -> float:
    return math.inf if x is None else x


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _observed(seq: Sequential) -> _Memory:
    p99 = seq.get("p99")
    return _Memory(
        _lo(seq["p99_ratio_lower"]),
        _hi(seq["p99_ratio_upper"]),
        _lo(seq["median_ratio_lower"]),
        _hi(seq["median_ratio_upper"]),
        p99 is not None and p99["slower"]["rejected"],
        p99 is not None and p99["faster"]["rejected"],
        p99 is not None and "exceedance_slower" in p99 and p99["exceedance_slower"]["rejected"],
        p99 is not None and "exceedance_faster" in p99 and p99["exceedance_faster"]["rejected"],
    )


class VerdictMemory:
    """Running intersection of the whole-run bounds and sticky two-sample crossings, per
    (model, metric)."""

    def __init__(self) -> None:
        self._memory: dict[tuple[str, str], _Memory] = {}
        self._ticks: dict[tuple[str, str], int] = {}

    def apply(self, result: StatsResult, *, tolerance: float) -> None:
        """Merge `result`'s whole-run evidence into the memory and rewrite its verdicts."""
        for model, windows in result["results"].items():
            res = windows.get(WHOLE_RUN)
            if res is None:
                continue
            for metric, block in res["metrics"].items():
                seq = block["sequential"]
                if seq is None:
                    continue
                key = (model, metric)
                now = _observed(seq)
                prev = self._memory.get(key)
                state = "first"
                merged = now
                if prev is not None:
                    merged, state = prev.merged(now), "intersected"
                    if merged.contradicts_itself(tolerance):
                        merged, state = now, "reset"
                        self._ticks[key] = 0
                self._memory[key] = merged
                self._ticks[key] = self._ticks.get(key, 0) + 1
                _rewrite(seq, merged, now, tolerance, state, self._ticks[key])
                block["verdict"] = seq["verdict"]


def _rewrite(
    seq: Sequential, m: _Memory, now: _Memory, tolerance: float, state: str, ticks: int
) -> None:
    seq["p99_ratio_lower"] = _finite(m.p99_lower) if m.p99_lower > 0 else 0.0
    seq["p99_ratio_upper"] = _finite(m.p99_upper)
    seq["median_ratio_lower"] = _finite(m.median_lower) if m.median_lower > 0 else 0.0
    seq["median_ratio_upper"] = _finite(m.median_upper)
    write_decision(seq, m.decision(tolerance))
    p99 = seq.get("p99")
    if p99 is not None:
        p99["slower"]["sticky"] = m.crossed_slower and not now.crossed_slower
        p99["faster"]["sticky"] = m.crossed_faster and not now.crossed_faster
        if "exceedance_slower" in p99 and "exceedance_faster" in p99:
            p99["exceedance_slower"]["sticky"] = m.exceeded_slower and not now.exceeded_slower
            p99["exceedance_faster"]["sticky"] = m.exceeded_faster and not now.exceeded_faster
    seq["hysteresis"] = state
    seq["hysteresis_ticks"] = ticks
