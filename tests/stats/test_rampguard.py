"""The guarded ramp against known-truth synthetic arms (tests/stats/ramp_sim.py: one tick per
virtual minute through the real decision code), and why its latency guard compares within steps:
pooled over a ramp while the load drifts, an A/A comparison is biased."""

from __future__ import annotations

import numpy as np
import pytest

from specproxy.config import RampConfig
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.rampguard import StepGuard
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
    guard = StepGuard(alpha=0.05, tolerance=0.05, steps=4)
    for k, (c_arm, t_arm) in enumerate(steps):
        c, t = _sample(c_arm, 25 * k, 25), _sample(t_arm, 25 * k, 25)
        if t.n >= 1000:
            assert abs(t.quantile(0.5) / c.quantile(0.5) - 1.0) < 0.05
        seq = guard.look(c, t, basis=k + 1, at=60.0 * 25 * (k + 1))
        assert seq is not None
        assert not seq["p99_slower"] and not seq["median_slower"]


def test_a_new_step_starts_the_guards_evidence_afresh() -> None:
    rng = np.random.default_rng(5)
    guard = StepGuard(alpha=0.05, tolerance=0.05, steps=1)
    c = ArmSample.from_values(control_sampler(rng, 3000, 1.0), np.zeros(3000, np.int64), 1)
    slow = ArmSample.from_values(2 * control_sampler(rng, 3000, 1.0), np.zeros(3000, np.int64), 1)
    same = ArmSample.from_values(control_sampler(rng, 3000, 1.0), np.zeros(3000, np.int64), 1)
    first = guard.look(c, slow, basis=1, at=60.0)
    assert first is not None and first["median_slower"]
    assert first["hysteresis"] == "first"
    again = guard.look(c, slow, basis=1, at=120.0)
    assert again is not None and again["hysteresis"] == "intersected"
    fresh = guard.look(c, same, basis=2, at=180.0)
    assert fresh is not None and not fresh["median_slower"]
    assert guard.look(c, ArmSample.empty(1), basis=2, at=240.0) is None
    with pytest.raises(ValueError, match="steps"):
        StepGuard(alpha=0.05, tolerance=0.05, steps=0)
