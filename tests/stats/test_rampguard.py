"""The guarded ramp against known-truth synthetic arms (tests/stats/ramp_sim.py: one tick per
virtual minute through the real decision code), why its latency guard compares within steps
(pooled over a ramp while the load drifts, an A/A comparison is biased), and that its guards,
folded in as requests land, are bit for bit those of re-reading the whole step every tick."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.config import RampConfig
from specproxy.stats.anytime.decision import DecisionMemory
from specproxy.stats.anytime.errorrate import ErrorRateTest, UnitErrors, error_rate_test
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.rampguard import StepGuard, StepRows
from specproxy.stats.result import Sequential
from specproxy.stats.sample import ArmSample
from tests.stats.ramp_sim import (
    control_sampler,
    drifting_load,
    faster,
    simulate,
    slower_p99,
)

POLICY = RampConfig(enabled=True, min_samples=200, min_minutes=5)
SAME = faster(1.0)


@pytest.mark.slow
def test_an_aa_treatment_is_never_cut_in_100_runs() -> None:
    runs = [simulate(np.random.default_rng(1000 + i), SAME, policy=POLICY) for i in range(100)]
    assert sum(r.cut for r in runs) <= 5  # alpha = 0.05; seen: 0
    assert all(r.final_weight == 0.5 for r in runs)


@pytest.mark.slow
def test_a_30pct_worse_p99_is_cut_after_about_what_the_p99_test_needs() -> None:
    def cut_at(policy: RampConfig, seed: int) -> int:
        run = simulate(
            np.random.default_rng(seed),
            slower_p99(1.3),
            policy=policy,
            minutes=240,
            stay_at_final=240,
        )
        assert run.cut and run.final_weight == 0.0
        assert run.decisions[-1].why.startswith("cut: E2E P99 slower")
        assert run.requests_at_cut is not None
        return run.requests_at_cut

    ramp = np.median([cut_at(POLICY, 2000 + i) for i in range(20)])
    alone = np.median(
        [cut_at(RampConfig(enabled=True, schedule=(0.5,)), 2000 + i) for i in range(20)]
    )
    # the P99 test alone, 50/50 from the start, needs ~4,000 treatment requests; the ramp
    # ~6,300: its early steps are small and each step's evidence starts afresh at alpha / 8
    # (medians of 100 runs: `python -m benchmarks.study_ramp --only worse`)
    assert alone < ramp < 3 * alone


@pytest.mark.slow
def test_a_15x_faster_treatment_reaches_the_final_step() -> None:
    runs = [
        simulate(np.random.default_rng(3000 + i), faster(1.5), policy=POLICY) for i in range(20)
    ]
    # every run reaches the final step; a false cut after it (any guard erring, <= alpha over
    # a run) is allowed once in 20: seen once in 100 (an error-rate crossing at 50%)
    reached = [any(d.step == 3 for d in r.decisions) for r in runs]
    assert all(reached)
    assert sum(r.cut for r in runs) <= 1
    steps = [d.weight for d in runs[0].decisions if d.weight is not None]
    assert steps == [0.01, 0.05, 0.25, 0.5]


def test_a_treatment_that_errs_three_times_as_often_is_cut_for_it() -> None:
    run = simulate(np.random.default_rng(4), SAME, policy=POLICY, treatment_error_rate=0.03)
    assert run.cut
    assert "error rate higher than the control's" in run.decisions[-1].why


Arm = tuple[np.ndarray, np.ndarray]  # values, minute of each


def _ramped_aa(rng: np.random.Generator) -> list[tuple[Arm, Arm]]:
    """An A/A treatment ramped 1% -> 5% -> 25% -> 50%, 25 minutes a step, 1,000 requests a
    minute, while the load's latency factor doubles: each step's (control, treatment) values
    and minutes of the run."""
    out = []
    for k, share in enumerate((0.01, 0.05, 0.25, 0.5)):
        vals: dict[str, list[np.ndarray]] = {"c": [], "t": []}
        mins: dict[str, list[np.ndarray]] = {"c": [], "t": []}
        for m in range(25 * k, 25 * k + 25):
            n_t = int(rng.binomial(1000, share))
            for arm, n in (("c", 1000 - n_t), ("t", n_t)):
                vals[arm].append(control_sampler(rng, n, drifting_load(m)))
                mins[arm].append(np.full(n, m))
        c, t = ((np.concatenate(vals[a]), np.concatenate(mins[a])) for a in ("c", "t"))
        out.append((c, t))
    return out


def _sample(arm: Arm, start: int, units: int) -> ArmSample:
    return ArmSample.from_values(arm[0], arm[1] - start, units)


def _whole_run(steps: list[tuple[Arm, Arm]], i: int) -> ArmSample:
    values = np.concatenate([s[i][0] for s in steps])
    minutes = np.concatenate([s[i][1] for s in steps])
    return ArmSample.from_values(values, minutes, 100)


def _rows(arm: Arm, start: int) -> StepRows:
    return StepRows.of(arm[1] - start, arm[0])


def test_pooled_over_a_ramp_an_aa_treatment_looks_slower_within_steps_it_does_not() -> None:
    steps = _ramped_aa(np.random.default_rng(11))
    control, treatment = _whole_run(steps, 0), _whole_run(steps, 1)
    # the treatment's requests crowd into the late, slow minutes: pooled, its median is ~24%
    # higher (1.243 +- 0.007 over 100 runs: `benchmarks.study_ramp --only drift`) and the
    # verdicts' own tests call the identical arm slower
    pooled_ratio = treatment.quantile(0.5) / control.quantile(0.5)
    assert pooled_ratio > 1.08
    pooled = evidence(control, treatment, alpha=0.05, tolerance=0.05).verdicts
    assert pooled.verdict == "slower"
    # within each step (one share) the ratio is 1 within its noise, and the step guard the
    # ramp runs passes every step
    guard = StepGuard(alpha=0.05, tolerance=0.05, steps=4, revise_s=3600.0)
    for k, (c_arm, t_arm) in enumerate(steps):
        c, t = _sample(c_arm, 25 * k, 25), _sample(t_arm, 25 * k, 25)
        if t.n >= 1000:
            assert abs(t.quantile(0.5) / c.quantile(0.5) - 1.0) < 0.05
        guard.begin(since=60.0 * 25 * k, basis=k + 1)
        end = 60.0 * 25 * (k + 1)
        guard.fold(_rows(c_arm, 25 * k), _rows(t_arm, 25 * k), until=end)
        seq = guard.look(at=end).seq
        assert seq is not None
        assert not seq["p99_slower"] and not seq["median_slower"]


def test_a_new_step_starts_the_guards_evidence_afresh() -> None:
    rng = np.random.default_rng(5)
    guard = StepGuard(alpha=0.05, tolerance=0.05, steps=1, revise_s=3600.0)
    zeros = np.zeros(3000, np.int64)
    c, slow, same = (
        StepRows.of(zeros, f * control_sampler(rng, 3000, 1.0)) for f in (1.0, 2.0, 1.0)
    )
    guard.begin(since=0.0, basis=1)
    guard.fold(c, slow, until=60.0)
    first = guard.look(at=60.0).seq
    assert first is not None and first["median_slower"]
    assert first["hysteresis"] == "first"
    again = guard.look(at=120.0).seq
    assert again is not None and again["hysteresis"] == "intersected"
    # another event within the step (a pause, a resume): the same requests, a fresh memory
    guard.begin(since=0.0, basis=2)
    paused = guard.look(at=150.0)
    assert paused.seq is not None and paused.seq["hysteresis"] == "first"
    assert paused.samples == 3000
    # a new step: nothing of the last one
    guard.begin(since=180.0, basis=3)
    assert guard.read_until == 180.0 and guard.look(at=180.0).seq is None
    guard.fold(c, same, until=240.0)
    fresh = guard.look(at=240.0)
    assert fresh.seq is not None and not fresh.seq["median_slower"] and fresh.samples == 3000
    with pytest.raises(ValueError, match="steps"):
        StepGuard(alpha=0.05, tolerance=0.05, steps=0, revise_s=0.0)


IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class _Requests:
    """One arm's requests of a step: minute, start, E2E, errored, usable."""

    unit: IntArray
    start: FloatArray
    e2e: FloatArray
    errored: npt.NDArray[np.bool_]
    usable: npt.NDArray[np.bool_]

    @property
    def end(self) -> FloatArray:
        return self.start + self.e2e

    def rows(self, mask: npt.NDArray[np.bool_]) -> StepRows:
        return StepRows.of(
            self.unit[mask], self.e2e[mask], usable=self.usable[mask], errored=self.errored[mask]
        )


def _requests(
    rng: np.random.Generator, minutes: int, *, slower: float, errors: float, longest: float
) -> _Requests:
    """~300 requests a minute, E2E log-normal (median 2 s x `slower`, sigma 0.5) with one in 200
    taking 10 s up to `longest`, a share `errors` errored (not usable), a few more not usable."""
    n = 300 * minutes
    start = np.sort(rng.uniform(0.0, 60.0 * minutes, n))
    e2e = 2.0 * slower * rng.lognormal(0.0, 0.5, n)
    long = rng.random(n) < 0.005
    e2e[long] = rng.uniform(10.0, longest, int(long.sum()))
    errored = rng.random(n) < errors
    usable = ~errored & (rng.random(n) > 0.01)  # e.g. a 4xx: counted, not timed
    unit = np.floor_divide(start, 60.0).astype(np.int64)
    return _Requests(unit, start, e2e, errored, usable)


def _full_reread(
    c: _Requests, t: _Requests, seen: float, memory: DecisionMemory, *, alpha: float, at: float
) -> tuple[Sequential | None, ErrorRateTest, int]:
    """What the ramp computed before it folded requests in: every request of the step landed
    by `seen`, re-read, as whole-step samples (`StepGuard` of issue 25's first version)."""
    landed = [(a, a.end < seen) for a in (c, t)]
    units = 1 + max((int(a.unit[m].max()) for a, m in landed if m.any()), default=0)
    samples = [
        ArmSample.from_values(a.e2e[m & a.usable], a.unit[m & a.usable], units) for a, m in landed
    ]
    counts = [
        (
            np.bincount(a.unit[m], minlength=units),
            np.bincount(a.unit[m & a.errored], minlength=units),
        )
        for a, m in landed
    ]
    errors = error_rate_test(
        [
            UnitErrors(
                int(counts[0][0][u]),
                int(counts[0][1][u]),
                int(counts[1][0][u]),
                int(counts[1][1][u]),
            )
            for u in range(units)
        ],
        alpha=alpha,
    )
    seq = None
    if samples[0].n and samples[1].n:
        now = evidence(samples[0], samples[1], alpha=alpha, tolerance=0.05)
        seq = memory.recall(("", "step", "e2e"), now, at=at, span_s=None).to_result()
    return seq, errors, samples[1].n


@pytest.mark.parametrize("revise_s", [150.0, 600.0])
def test_folding_requests_as_they_land_gives_the_guards_of_rereading_the_step(
    revise_s: float,
) -> None:
    """Tick by tick (every 20 s over 90 minutes, requests landing at their ends, some after 2
    minutes), the guards fed only what landed since the last tick, keeping the minutes no
    request can land in any more as pools and paths, say exactly what re-reading the whole step
    said: the same sequential block (bounds, e-values, crossings), error-rate test and count."""
    rng = np.random.default_rng(int(revise_s))
    c = _requests(rng, 90, slower=1.0, errors=0.01, longest=revise_s - 5.0)
    t = _requests(rng, 90, slower=1.3, errors=0.02, longest=revise_s - 5.0)
    guard = StepGuard(alpha=0.05, tolerance=0.05, steps=1, revise_s=revise_s)
    guard.begin(since=0.0, basis=1)
    memory = DecisionMemory()
    crossed: set[str] = set()
    prev = 0.0
    for tick in np.arange(20.0, 60.0 * 92, 20.0):
        guard.fold(*(a.rows((a.end >= prev) & (a.end < tick)) for a in (c, t)), until=tick)
        prev = tick
        look = guard.look(at=tick)
        seq, errors, samples = _full_reread(c, t, tick, memory, alpha=0.05, at=tick)
        assert (look.seq, look.errors, look.samples) == (seq, errors, samples), tick
        if seq is not None:
            crossed |= {k for k in ("p99_slower", "median_slower") if seq[k]}
        if errors.rejected:
            crossed.add("errors")
        assert look.late == 0
    # the evidence crossed while minutes were being settled, so crossings carried over
    assert crossed == {"p99_slower", "median_slower", "errors"}


def test_a_request_longer_than_the_horizon_still_counts_in_the_confidence_sequences() -> None:
    guard = StepGuard(alpha=0.05, tolerance=0.05, steps=1, revise_s=120.0)
    guard.begin(since=0.0, basis=1)
    rng = np.random.default_rng(3)
    for minute in range(10):  # 100 requests a minute per arm, landing at the minute's end
        unit = np.full(100, minute)
        rows = [StepRows.of(unit, rng.lognormal(0.0, 0.5, 100)) for _ in range(2)]
        guard.fold(*rows, until=60.0 * (minute + 1))
    assert guard.look(at=600.0).samples == 1000
    # a treatment request of minute 0, 10 minutes long, and one that errored: their minute is
    # settled (120 s after its end, and two later minutes hold requests)
    late = StepRows.of([0, 0], [600.0, 600.0], errored=[False, True], usable=[True, False])
    guard.fold(StepRows.of([], []), late, until=610.0)
    look = guard.look(at=610.0)
    assert look.samples == 1001 and look.late == 2
