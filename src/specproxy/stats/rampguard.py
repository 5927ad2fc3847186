"""The guarded ramp's guards on the current step, folded in as the step's requests land.

Within one step of the ramp the treatment's share is constant, so both arms' requests are spread
over the same minutes in the same proportion and their pooled distributions carry the same load
mix: a comparison within the step is unbiased however the load drifts. Pooled over the steps it
is not: the treatment's requests crowd into the late, high-share minutes, so a load that grows
over the run makes an A/A treatment look slower (tests/stats/test_rampguard.py measures it). The
guard therefore runs the verdicts' own tests (`stats.anytime.verdict`: the P99 and median ratio
confidence sequences and the per-minute exceedance e-processes, held across ticks by a
`DecisionMemory` of its own) and the error-rate e-process (`stats.anytime.errorrate`) on the
step's requests only, each guard at its share of alpha split over the schedule's steps (the job
gives each guard alpha / 2: a union bound over the two guards and the steps, so the ramp's
false-cut probability over a whole run stays <= alpha). The ramp reads the `Sequential` block it
returns exactly as the verdicts read theirs (`control.ramp`).

Bounded per tick. The step's requests are folded in once, as they land (`fold`: the requests
that ended since the last fold), and a look costs what the step's recent minutes hold, however
long the step has lasted:
- the confidence sequences read each arm's histogram of the step's usable E2E on the fixed grid
  (`summary.grid`): bounded by the grid, and a request lands in it whenever it ends;
- the exceedance and error-rate e-processes run over the minutes a request may still land in
  (`revise_s` after the minute's end: the longest request the arms' timeouts allow; and the
  exceedance test's last `SETTLE_UNITS`), continuing the thresholds' pool and the paths kept for
  the minutes before (`BaselinePool`, `ExceedancePath`, `ErrorRatePath`).
The result is bit for bit the tests on all of the step's requests landed so far, as a full
re-read of the step each tick computed them (tests/stats/test_rampguard.py compares the two tick
by tick), so the guard is exactly as valid as that re-read. The one difference: a request that
lands more than `revise_s` after its minute ended (only one longer than the timeouts allow)
still enters the confidence sequences, but not the e-processes, whose paths have moved past its
minute; it is counted (`StepLook.late`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt

from specproxy.stats import result as schema
from specproxy.stats.anytime.decision import DecisionMemory
from specproxy.stats.anytime.errorrate import (
    ErrorRatePath,
    ErrorRateTest,
    UnitErrors,
    error_rate_path,
    error_rate_test,
)
from specproxy.stats.anytime.exceedance import (
    SETTLE_UNITS,
    BaselinePool,
    BinnedUnits,
    ExceedancePath,
    baseline_walk,
    exceedance_test,
    true_edges,
    unit_counts,
)
from specproxy.stats.anytime.verdict import exceedance_evidence
from specproxy.stats.sample import ArmSample
from specproxy.summary.histogram import bin_index

__all__ = ["UNIT_S", "StepGuard", "StepLook", "StepRows"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

UNIT_S: Final = 60.0  # the e-processes' time unit: a minute of the step


@dataclass(frozen=True, slots=True)
class StepRows:
    """One arm's primary requests of the step (not shadow, not rerouted, client connected), a
    batch of those that landed since the last fold: each one's minute of the step (>= 0),
    whether it errored (the error-rate guard), and whether its E2E is usable (the latency
    guard; `e2e` is read only there)."""

    unit: IntArray
    errored: BoolArray
    usable: BoolArray
    e2e: FloatArray

    @classmethod
    def of(
        cls,
        unit: npt.ArrayLike,
        e2e: npt.ArrayLike,
        *,
        usable: npt.ArrayLike | None = None,
        errored: npt.ArrayLike | None = None,
    ) -> StepRows:
        """From arrays (usable: every one with E2E > 0 by default; errored: none)."""
        u = np.asarray(unit, dtype=np.int64)
        v = np.asarray(e2e, dtype=np.float64)
        ok = v > 0 if usable is None else np.asarray(usable, dtype=bool)
        bad = np.zeros(u.size, dtype=bool) if errored is None else np.asarray(errored, dtype=bool)
        if not u.shape == v.shape == ok.shape == bad.shape:
            raise ValueError("a batch's arrays must have one length")
        if u.size and int(u.min()) < 0:
            raise ValueError("minutes of the step are >= 0")
        return cls(u, bad, ok & (v > 0), v)


@dataclass(frozen=True, slots=True)
class StepLook:
    """The guards at one look: the E2E metric's `sequential` block (None: an arm has no usable
    request in the step yet), the error-rate test, the treatment's usable requests in the step,
    and the requests that landed after their minute left the e-processes (see the module)."""

    seq: schema.Sequential | None
    errors: ErrorRateTest
    samples: int
    late: int


@dataclass(slots=True)
class _Histogram:
    """One arm's usable E2E over the whole step, as dense counts on the fine grid from `lo`."""

    lo: int = 0
    counts: IntArray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    total: float = 0.0

    def add(self, bins: IntArray, values: FloatArray) -> None:
        if bins.size == 0:
            return
        lo = int(bins.min()) if not self.counts.size else min(self.lo, int(bins.min()))
        hi = max(self.lo + self.counts.size, int(bins.max()) + 1)
        if (lo, hi) != (self.lo, self.lo + self.counts.size):
            grown = np.zeros(hi - lo, dtype=np.int64)
            grown[self.lo - lo : self.lo - lo + self.counts.size] = self.counts
            self.lo, self.counts = lo, grown
        self.counts += np.bincount(bins - self.lo, minlength=self.counts.size)
        self.total += float(values.sum())

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def sample(self) -> ArmSample:
        """The histogram as a one-unit sample (its order statistics are the rows' own)."""
        at = np.flatnonzero(self.counts)
        counts = self.counts[at]
        return ArmSample(
            units=1,
            unit=np.zeros(at.size, dtype=np.int64),
            bins=(at + self.lo).astype(np.int64),
            counts=counts,
            unit_n=np.array([int(counts.sum())], dtype=np.int64),
            unit_sum=np.array([self.total]),
            unit_s=UNIT_S,
        )


@dataclass(slots=True)
class _Open:
    """One arm's minutes still open to late requests: per minute a sparse fine-grid histogram of
    the usable E2E (for the exceedance tests), and its primary requests and errors (for the
    error-rate test)."""

    bins: dict[int, tuple[IntArray, IntArray]] = field(default_factory=dict)
    requests: dict[int, list[int]] = field(default_factory=dict)  # unit -> [requests, errors]

    def add_values(self, unit: IntArray, bins: IntArray) -> None:
        for u in np.unique(unit).tolist():
            new = bins[unit == u]
            old_bins, old_counts = self.bins.get(u, (new[:0], new[:0]))
            key, at = np.unique(np.concatenate([old_bins, new]), return_inverse=True)
            weights = np.concatenate([old_counts, np.ones(new.size, dtype=np.int64)])
            self.bins[u] = (key, np.bincount(at, weights=weights).astype(np.int64))

    def add_requests(self, unit: IntArray, errored: BoolArray) -> None:
        units, n = np.unique(unit, return_counts=True)
        k = np.bincount(unit, weights=errored.astype(np.float64))[units] if unit.size else n
        for u, requests, errors in zip(units.tolist(), n.tolist(), k.tolist(), strict=True):
            counts = self.requests.setdefault(u, [0, 0])
            counts[0] += requests
            counts[1] += round(errors)

    def binned(self, first: int, stop: int) -> BinnedUnits:
        """Its histogram entries of minutes first..stop-1, numbered from `first`."""
        units = sorted(u for u in self.bins if first <= u < stop)
        parts = [self.bins[u] for u in units]
        unit = np.repeat(np.array(units, dtype=np.int64) - first, [b.size for b, _ in parts])
        bins = np.concatenate([b for b, _ in parts]) if parts else np.zeros(0, dtype=np.int64)
        counts = np.concatenate([c for _, c in parts]) if parts else np.zeros(0, dtype=np.int64)
        lower, upper = true_edges(bins)
        return BinnedUnits(unit, bins, lower, upper, counts)


def _errors(control: _Open, treatment: _Open, first: int, stop: int) -> list[UnitErrors]:
    nothing = [0, 0]
    out = []
    for u in range(first, stop):
        (c_n, c_k), (t_n, t_k) = (a.requests.get(u, nothing) for a in (control, treatment))
        out.append(UnitErrors(c_n, c_k, t_n, t_k))
    return out


class _Step:
    """Everything the guards keep of one step (the module docstring says what and why)."""

    def __init__(self, since: float, *, revise_s: float, tolerance: float, alpha: float) -> None:
        self.since = since
        self.read_until = since  # the requests that ended before this have been folded in
        self.revise_s = revise_s
        self.tolerance = tolerance
        self.alpha = alpha
        self.pooled = (_Histogram(), _Histogram())  # control, treatment: the whole step
        self.open = (_Open(), _Open())
        self.first = 0  # the exceedance tests have settled the minutes before this one
        self.first_errors = 0  # and the error-rate test these
        self.last_usable = -1  # the latest minute holding a usable request (either arm)
        self.last = -1  # the latest minute holding a request (either arm)
        self.pools = (BaselinePool.empty(), BaselinePool.empty())  # control's, treatment's
        self.paths = (ExceedancePath(), ExceedancePath())  # slower, faster
        self.error_path = ErrorRatePath()
        self.late = 0

    def add(self, arms: tuple[StepRows, StepRows]) -> None:
        for rows, pooled, open_ in zip(arms, self.pooled, self.open, strict=True):
            ok = rows.usable
            bins = bin_index(rows.e2e[ok])
            pooled.add(bins, rows.e2e[ok])  # whatever its minute
            unit = rows.unit[ok]
            fresh = unit >= self.first
            open_.add_values(unit[fresh], bins[fresh])
            counted = rows.unit >= self.first_errors
            open_.add_requests(rows.unit[counted], rows.errored[counted])
            self.late += int((~counted | (ok & (rows.unit < self.first))).sum())
            if unit.size:
                self.last_usable = max(self.last_usable, int(unit.max()))
            if rows.unit.size:
                self.last = max(self.last, int(rows.unit.max()))

    def settle(self) -> None:
        """Move the minutes no request can land in any more (and, for the exceedance tests,
        that they use) from the open minutes into the kept pools and paths."""
        aged = math.floor((self.read_until - self.revise_s - self.since) / UNIT_S)
        stop = min(aged, self.last_usable + 1 - SETTLE_UNITS)
        if stop > self.first:
            k = stop - self.first
            c, t = (o.binned(self.first, stop) for o in self.open)
            slower = unit_counts(c, t, tolerance=self.tolerance, start=self.pools[0], units=k)
            faster = unit_counts(t, c, tolerance=self.tolerance, start=self.pools[1], units=k)
            self.paths = (self.paths[0].extended(slower, k), self.paths[1].extended(faster, k))
            self.pools = (
                baseline_walk(c.unit, c.bins, c.counts, k, self.pools[0], keep=k)[1],
                baseline_walk(t.unit, t.bins, t.counts, k, self.pools[1], keep=k)[1],
            )
            for o in self.open:
                for u in [u for u in o.bins if u < stop]:
                    del o.bins[u]
            self.first = stop
        if aged > self.first_errors:  # (minutes after the last request's hold none)
            units = _errors(*self.open, self.first_errors, min(aged, self.last + 1))
            self.error_path = error_rate_path(units, alpha=self.alpha, start=self.error_path)
            for o in self.open:
                for u in [u for u in o.requests if u < aged]:
                    del o.requests[u]
            self.first_errors = aged

    def errors(self) -> ErrorRateTest:
        units = _errors(*self.open, self.first_errors, self.last + 1)
        return error_rate_test(units, alpha=self.alpha, start=self.error_path)

    def latency(self, memory: DecisionMemory, at: float) -> schema.Sequential | None:
        control, treatment = (p.sample() for p in self.pooled)
        if control.n == 0 or treatment.n == 0:
            return None
        units = self.last_usable + 1 - self.first
        c, t = (o.binned(self.first, self.last_usable + 1) for o in self.open)
        level = self.alpha / 2.0
        tol = self.tolerance
        s_counts = unit_counts(c, t, tolerance=tol, start=self.pools[0], units=units)
        f_counts = unit_counts(t, c, tolerance=tol, start=self.pools[1], units=units)
        slower = exceedance_test(s_counts, alpha=level, start=self.paths[0])
        faster = exceedance_test(f_counts, alpha=level, start=self.paths[1])
        now = exceedance_evidence(
            control, treatment, slower, faster, alpha=self.alpha, tolerance=tol
        )
        return memory.recall(("", "step", "e2e"), now, at=at, span_s=None).to_result()


class StepGuard:
    """One treatment arm's guards over the ramp: `begin` each tick with the step (the time of
    the event that set its weight) and the arm's newest event, `fold` the step's requests that
    landed, `look`. A new step starts everything afresh; a new event within the step (a pause,
    a resume) starts the latency evidence's memory afresh. `alpha`: each guard's level over a
    run, split over the schedule's `steps` (the job gives each guard half the stats alpha);
    `revise_s`: how long after its minute a request may still land (the longest request the
    timeouts allow)."""

    def __init__(self, *, alpha: float, tolerance: float, steps: int, revise_s: float) -> None:
        if steps < 1:
            raise ValueError("steps must be >= 1")
        if revise_s < 0:
            raise ValueError("revise_s must be >= 0")
        self.alpha = alpha / steps  # each guard's level within one step
        self.tolerance = tolerance
        self.revise_s = revise_s
        self._memory = DecisionMemory()
        self._basis: int | None = None
        self._step: _Step | None = None

    @property
    def read_until(self) -> float:
        """The step's requests that ended before this time are folded in (`begin` first)."""
        if self._step is None:
            raise RuntimeError("no step begun")
        return self._step.read_until

    def begin(self, *, since: float, basis: int) -> None:
        if self._step is None or self._step.since != since:
            self._step = _Step(
                since, revise_s=self.revise_s, tolerance=self.tolerance, alpha=self.alpha
            )
        if basis != self._basis:
            self._memory, self._basis = DecisionMemory(), basis

    def fold(self, control: StepRows, treatment: StepRows, *, until: float) -> None:
        """Add the step's requests that ended in [`read_until`, `until`)."""
        step = self._step
        if step is None:
            raise RuntimeError("no step begun")
        step.add((control, treatment))
        step.read_until = max(step.read_until, until)
        step.settle()

    def open_minutes(self) -> tuple[int, int]:
        """The minutes kept open to late requests (for the exceedance tests) and their histogram
        entries, both arms: what a look's work grows with (`benchmarks/ramp_tick.py`)."""
        step = self._step
        if step is None:
            return 0, 0
        entries = sum(b.size for o in step.open for b, _ in o.bins.values())
        return len({u for o in step.open for u in o.bins}), entries

    def look(self, *, at: float) -> StepLook:
        """The guards on what has been folded in (`at`: the tick's time)."""
        step = self._step
        if step is None:
            raise RuntimeError("no step begun")
        seq = step.latency(self._memory, at)
        return StepLook(seq, step.errors(), step.pooled[1].n, step.late)
