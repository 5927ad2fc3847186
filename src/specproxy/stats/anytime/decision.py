"""One metric's anytime-valid verdict as values: a tick's evidence, what a window keeps of it across
ticks, and the one rule that turns evidence into faster, slower or inconclusive.

Ratios are treatment / control (> 1: the treatment is slower). The P99 verdict has two tests per
direction, each at alpha / 2 (a union bound): the ratio's confidence sequence, and the design's
e-process (per-minute exceedance on split traffic, two-sample on mirrored pairs). The median is
its confidence sequence at alpha. A window keeps its evidence across ticks (`DecisionMemory`):
bounds are intersected and crossings kept, which is valid because a confidence sequence holds at
all times and an e-process crosses at any time with probability <= alpha (Ville); the verdict
therefore changes only when evidence crosses a bound, never on noise between ticks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from specproxy.stats import result as schema
from specproxy.stats.result import Verdict

__all__ = ["Decision", "DecisionMemory", "EProcess", "Evidence", "Verdicts", "fresh"]

Test = Literal["exceedance", "two_sample"]
MemoryState = Literal["first", "intersected", "reset"]


@dataclass(frozen=True, slots=True)
class EProcess:
    """One direction of the design's P99 e-process at level alpha / 2."""

    statistic: float | None  # log e-value at this tick (None: not run)
    boundary: float  # log(2 / alpha)
    rejected: bool  # crossed (in held evidence: at this or an earlier tick)

    def merged(self, other: EProcess) -> EProcess:
        return replace(other, rejected=self.rejected or other.rejected)


@dataclass(frozen=True, slots=True)
class Evidence:
    """What the anytime-valid tests establish about one metric, at one tick or held over ticks."""

    p99: tuple[float, float]  # bounds on the P99 ratio, level alpha / 2 ((0, inf): none)
    median: tuple[float, float]  # bounds on the median ratio, level alpha
    slower: EProcess  # "treatment P99 > (1 + tolerance) x control P99"
    faster: EProcess  # "control P99 > (1 + tolerance) x treatment P99"
    test: Test
    level: float  # alpha / 2
    tolerance: float
    binned: bool  # order statistics and counts read off histograms

    def merged(self, now: Evidence) -> Evidence:
        """This evidence held, `now` added: bounds intersected, crossings kept."""
        return replace(
            now,
            p99=(max(self.p99[0], now.p99[0]), min(self.p99[1], now.p99[1])),
            median=(max(self.median[0], now.median[0]), min(self.median[1], now.median[1])),
            slower=self.slower.merged(now.slower),
            faster=self.faster.merged(now.faster),
        )

    @property
    def verdicts(self) -> Verdicts:
        c = 1.0 + self.tolerance
        return Verdicts(
            p99_union_slower=self.p99[0] > c,
            p99_union_faster=self.p99[1] < 1.0 / c,
            e_slower=self.slower.rejected,
            e_faster=self.faster.rejected,
            test=self.test,
            median_slower=self.median[0] > 1.0,
            median_faster=self.median[1] < 1.0,
        )

    @classmethod
    def of_result(cls, seq: schema.Sequential, tolerance: float) -> Evidence | None:
        """The evidence a stored `sequential` block held (`Decision.to_result`), so a new
        leader starts from its predecessor's memory; None for a block without its P99 part."""
        p99 = seq.get("p99")
        if p99 is None:
            return None
        test: Test = "two_sample" if "two_sample" in p99.get("tests", []) else "exceedance"
        slower = p99["slower"] if test == "two_sample" else p99.get("exceedance_slower")
        faster = p99["faster"] if test == "two_sample" else p99.get("exceedance_faster")
        if slower is None or faster is None:
            return None

        def e(block: schema.TwoSampleP99) -> EProcess:
            return EProcess(block["statistic"], block["boundary"], block["rejected"])

        def bounds(lo: float | None, hi: float | None) -> tuple[float, float]:
            return (lo if lo is not None else 0.0, hi if hi is not None else math.inf)

        return cls(
            p99=bounds(seq["p99_ratio_lower"], seq["p99_ratio_upper"]),
            median=bounds(seq["median_ratio_lower"], seq["median_ratio_upper"]),
            slower=e(slower),
            faster=e(faster),
            test=test,
            level=p99["level"],
            tolerance=tolerance,
            binned=p99["binned"],
        )

    def contradicts_itself(self) -> bool:
        """Empty bounds, or P99 evidence both ways: under the model one test erred."""
        empty = self.p99[0] > self.p99[1] or self.median[0] > self.median[1]
        return empty or self.verdicts.p99_conflict


@dataclass(frozen=True, slots=True)
class Verdicts:
    """The rule, in one place. P99: slower when a slower test rejects and no faster one does,
    faster symmetrically, else inconclusive. Median: its bounds exclude 1. The metric: slower if
    the P99 or the median is slower (a slower tail is never outweighed by a faster median), else
    faster if either is faster, else inconclusive."""

    p99_union_slower: bool
    p99_union_faster: bool
    e_slower: bool
    e_faster: bool
    test: Test
    median_slower: bool
    median_faster: bool

    @property
    def p99_conflict(self) -> bool:
        return (self.p99_union_slower or self.e_slower) and (self.p99_union_faster or self.e_faster)

    @property
    def p99(self) -> Verdict:
        if self.p99_conflict:
            return "inconclusive"
        if self.p99_union_slower or self.e_slower:
            return "slower"
        return "faster" if self.p99_union_faster or self.e_faster else "inconclusive"

    @property
    def median(self) -> Verdict:
        if self.median_slower:
            return "slower"
        return "faster" if self.median_faster else "inconclusive"

    @property
    def verdict(self) -> Verdict:
        both = (self.p99, self.median)
        if "slower" in both:
            return "slower"
        return "faster" if "faster" in both else "inconclusive"

    @property
    def p99_decided_by(self) -> list[str]:
        """The P99 tests behind the P99 verdict: "union_bound", and the design's e-process."""
        if self.p99 == "inconclusive":
            return []
        union, e = (
            (self.p99_union_slower, self.e_slower)
            if self.p99 == "slower"
            else (self.p99_union_faster, self.e_faster)
        )
        return [name for name, hit in (("union_bound", union), (self.test, e)) if hit]

    @property
    def decided_by(self) -> list[str]:
        """The tests behind `verdict`: "p99_union_bound", "p99_exceedance", "p99_two_sample",
        "median"."""
        v = self.verdict
        out = [f"p99_{name}" for name in self.p99_decided_by] if self.p99 == v else []
        return [*out, "median"] if v != "inconclusive" and self.median == v else out


@dataclass(frozen=True, slots=True)
class Decision:
    """A metric's verdict: the evidence held (this tick's, or merged over the window's memory)
    and this tick's own."""

    held: Evidence
    now: Evidence
    memory: MemoryState | None = None  # None: no memory (a one-off computation)
    ticks: int = 0  # ticks whose evidence is held

    @property
    def verdicts(self) -> Verdicts:
        return self.held.verdicts

    @property
    def verdict(self) -> Verdict:
        return self.verdicts.verdict

    def to_result(self) -> schema.Sequential:
        """The `sequential` block of a metric result."""
        v, held, now = self.verdicts, self.held, self.now
        pair = ("two_sample", "exceedance")
        e_slower = {t: _e_result(held.slower, now.slower, t == held.test) for t in pair}
        e_faster = {t: _e_result(held.faster, now.faster, t == held.test) for t in pair}
        p99: schema.P99Verdict = {
            "verdict": v.p99,
            "decided_by": v.p99_decided_by,
            "level": held.level,
            "union_bound_slower": v.p99_union_slower,
            "union_bound_faster": v.p99_union_faster,
            "slower": e_slower["two_sample"],
            "faster": e_faster["two_sample"],
            "binned": held.binned,
            "tests": ["union_bound", held.test],
            "exceedance_slower": e_slower["exceedance"],
            "exceedance_faster": e_faster["exceedance"],
        }
        return {
            "p99_ratio_lower": _lower(held.p99[0]),
            "p99_ratio_upper": _finite(held.p99[1]),
            "median_ratio_lower": _lower(held.median[0]),
            "median_ratio_upper": _finite(held.median[1]),
            "p99_slower": v.p99 == "slower",
            "median_faster": v.median == "faster",
            "median_slower": v.median == "slower",
            "verdict": v.verdict,
            "hysteresis": self.memory,
            "hysteresis_ticks": self.ticks,
            "decided_by": v.decided_by,
            "p99": p99,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def _lower(x: float) -> float | None:
    return 0.0 if x <= 0 else _finite(x)


def _e_result(held: EProcess, now: EProcess, ran: bool) -> schema.TwoSampleP99:
    """One direction of an e-process as the result shows it; a test the design does not run
    shows as never run."""
    if not ran:
        return {"statistic": None, "boundary": now.boundary, "rejected": False, "sticky": False}
    return {
        "statistic": now.statistic,
        "boundary": now.boundary,
        "rejected": held.rejected,
        "sticky": held.rejected and not now.rejected,
    }


def fresh(now: Evidence) -> Decision:
    """A decision without memory: this tick's evidence alone."""
    return Decision(now, now)


@dataclass(slots=True)
class _Kept:
    ticks: list[tuple[float, Evidence]] = field(default_factory=list)  # sliding windows
    held: Evidence | None = None  # the whole run
    count: int = 0


class DecisionMemory:
    """Per (segment, window, metric), the evidence a window keeps across ticks.

    The whole run keeps everything: the running intersection and every crossing. A sliding window
    of w seconds keeps the evidence of the ticks of the last w seconds (the requests that gave it
    may still be in the window), so its verdict holds until that evidence has left the window and
    never flaps on one noisy tick. Evidence that contradicts itself (empty bounds, P99 both ways:
    a test erred) restarts the memory from the current tick ("reset"). The memory lives in the
    computing process and starts empty there (or from the last stored result, `seed`).
    """

    def __init__(self) -> None:
        self._kept: dict[tuple[str, str, str], _Kept] = {}

    def recall(
        self, key: tuple[str, str, str], now: Evidence, *, at: float, span_s: float | None
    ) -> Decision:
        """Add `now` (evidence of the tick at Unix time `at`) to the window's memory and return
        the decision it holds; `span_s` None: the whole run."""
        kept = self._kept.setdefault(key, _Kept())
        if span_s is None:
            candidates = [kept.held] if kept.held is not None else []
        else:
            kept.ticks = [(t, e) for t, e in kept.ticks if at - span_s < t < at]
            candidates = [e for _t, e in kept.ticks]
        held = now
        for evidence in candidates:
            held = evidence.merged(held)
        state: MemoryState = "intersected" if candidates else "first"
        if held.contradicts_itself():
            held, state = now, "reset"
        reset = state == "reset"
        if span_s is None:
            kept.held = held
            kept.count = 1 if reset else kept.count + 1
            return Decision(held, now, state, kept.count)
        kept.ticks = [(at, now)] if reset else [*kept.ticks, (at, now)]
        return Decision(held, now, state, len(kept.ticks))

    def seed(self, decisions: Mapping[tuple[str, str, str], tuple[float, Evidence]]) -> None:
        """Start from evidence held elsewhere (a new leader: the last stored result's)."""
        for key, (at, evidence) in decisions.items():
            self._kept[key] = _Kept([(at, evidence)], evidence, 1)
