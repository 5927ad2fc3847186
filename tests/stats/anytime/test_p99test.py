"""Tests of the two-sample anytime-valid P99 test (`anytime.p99test`), which runs on the exact
values of mirrored pairs.

Simulations are seeded. Reproduce the printed figures with
    .venv/bin/pytest tests/stats/anytime/test_p99test.py -q -s -m "slow or not slow"
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt
import pytest
import scipy.signal
import scipy.stats

from specproxy.stats.anytime import p99test
from specproxy.stats.anytime.p99test import P99TestResult, p99_slower_test
from specproxy.stats.anytime.sequential import (
    DEFAULT_TUNED_FOR_N,
    log_mixture_counts,
    mixture_strength,
    ratio_bounds,
)
from specproxy.stats.sample import ArmSample

FloatArray = npt.NDArray[np.float64]
ALPHA = 0.05


def _lognormal_ar1(rng: np.random.Generator, n: int, sigma: float, rho: float) -> FloatArray:
    """Log-normal latencies whose log follows a stationary AR(1) with marginal sd `sigma`."""
    eps = rng.standard_normal(n) * sigma * math.sqrt(1.0 - rho * rho)
    first = rng.standard_normal() * sigma
    log_x = scipy.signal.lfilter([1.0], [1.0, -rho], eps, zi=[rho * first])[0]
    return np.asarray(np.exp(log_x), dtype=np.float64)


def _brute_force_statistic(base: FloatArray, spec: FloatArray, tol: float) -> float:
    """min over every q of log E_b(q) + log E_s(q), by direct enumeration of q."""
    scaled = spec / (1.0 + tol)
    points = np.unique(np.concatenate([base, scaled]))
    below = np.nextafter(points, -np.inf)
    qs = np.concatenate([[np.inf], points, below])
    rate = 0.01
    strength = mixture_strength(rate, DEFAULT_TUNED_FOR_N)
    kb = np.array([(base >= q).sum() for q in qs], dtype=np.int64)
    ks = np.array([(scaled > q).sum() for q in qs], dtype=np.int64)
    log_eb = p99test._floored(log_mixture_counts(base.size, kb, rate, strength, False))
    log_es = p99test._floored(log_mixture_counts(spec.size, ks, rate, strength, True))
    return float(np.min(log_eb + log_es))


def test_empty_arm_is_undecided() -> None:
    r = p99_slower_test(np.array([1.0, 2.0]), np.array([], dtype=np.float64))
    assert r.decision == "undecided"
    assert r.statistic == -math.inf
    assert (r.samples_baseline, r.samples_speculative) == (2, 0)
    assert r.boundary == pytest.approx(math.log(1 / ALPHA))


def test_rejects_bad_parameters() -> None:
    x = np.ones(3)
    with pytest.raises(ValueError, match="alpha"):
        p99_slower_test(x, x, alpha=0.0)
    with pytest.raises(ValueError, match="tolerance"):
        p99_slower_test(x, x, tolerance=-0.1)


def test_result_is_frozen() -> None:
    r = p99_slower_test(np.ones(3), np.ones(3))
    assert isinstance(r, P99TestResult)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.decision = "slower"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("n_b", "n_s", "factor", "tol"),
    [
        (300, 250, 1.0, 0.0),
        (400, 400, 1.6, 0.05),
        (500, 200, 3.0, 0.1),
        (150, 600, 0.8, 0.0),
    ],
)
def test_statistic_matches_enumeration_of_every_quantile(
    n_b: int, n_s: int, factor: float, tol: float
) -> None:
    """The pruned walk over candidate quantiles gives the brute-force infimum (or, where the
    infimum lies in the pruned region, both are past the boundary)."""
    rng = np.random.default_rng(n_b + n_s)
    base = rng.lognormal(0.0, 0.5, n_b)
    spec = factor * rng.lognormal(0.0, 0.5, n_s)
    r = p99_slower_test(base, spec, tolerance=tol)
    brute = _brute_force_statistic(base, spec, tol)
    assert (r.statistic >= r.boundary) == (brute >= r.boundary)
    if brute < r.boundary:
        assert r.statistic == pytest.approx(brute, rel=1e-9, abs=1e-9)


def test_ties_and_atoms_do_not_crash_and_stay_undecided_for_equal_arms() -> None:
    x = np.repeat(np.array([1.0, 2.0, 3.0]), 700)
    r = p99_slower_test(x, x.copy(), tolerance=0.0)
    assert r.decision == "undecided"


def test_null_boundary_at_a_tolerance_is_the_scaled_a_a_case() -> None:
    """spec = (1 + tol) x baseline in law with tolerance tol is the same test as A/A with
    tolerance 0 (quantiles are scale-equivariant): the statistic is unchanged."""
    rng = np.random.default_rng(3)
    base, spec = rng.lognormal(0.0, 0.5, 2000), rng.lognormal(0.0, 0.5, 1500)
    at_zero = p99_slower_test(base, spec, tolerance=0.0)
    scaled = p99_slower_test(base, spec * 1.25, tolerance=0.25)
    assert scaled.statistic == pytest.approx(at_zero.statistic, rel=1e-9)
    assert scaled.decision == at_zero.decision


def test_detects_a_large_slowdown_and_not_a_speedup() -> None:
    rng = np.random.default_rng(7)
    base = rng.lognormal(0.0, 0.5, 3000)
    assert p99_slower_test(base, 2.0 * rng.lognormal(0.0, 0.5, 3000)).decision == "slower"
    assert p99_slower_test(base, 0.5 * rng.lognormal(0.0, 0.5, 3000)).decision == "undecided"


# A/A false alarms, one look every 100 samples per arm up to 3000 per arm, tolerance 0 (the
# boundary of the null, where false alarms are likeliest). RUNS runs per noise model; the assert
# allows Monte-Carlo error: false alarms <= the 99.9% quantile of Binomial(RUNS, alpha).
RUNS = 500
LOOK_EVERY = 100
N_AA = 3000


def _false_alarm_count(rho: float, seed: int) -> int:
    rng = np.random.default_rng(seed)
    alarms = 0
    for _ in range(RUNS):
        base = _lognormal_ar1(rng, N_AA, 0.5, rho)
        spec = _lognormal_ar1(rng, N_AA, 0.5, rho)
        for n in range(LOOK_EVERY, N_AA + 1, LOOK_EVERY):
            if p99_slower_test(base[:n], spec[:n], tolerance=0.0).decision == "slower":
                alarms += 1
                break
    return alarms


@pytest.mark.slow
@pytest.mark.parametrize(("rho", "seed"), [(0.0, 11), (0.3, 12)])
def test_aa_false_alarms_at_most_alpha_over_repeated_looks(rho: float, seed: int) -> None:
    alarms = _false_alarm_count(rho, seed)
    bound = int(scipy.stats.binom.ppf(0.999, RUNS, ALPHA))
    print(f"A/A rho={rho}: {alarms}/{RUNS} runs ever 'slower' (bound {bound})")
    assert alarms <= bound


# Power for a +10% P99 (spec = 1.1 x baseline in distribution, lognormal sigma 0.5), evaluated
# at 5k, 10k and 20k per arm on the same data for both tests: this one, and the union bound of
# the arms' confidence sequences at alpha (`sequential.ratio_bounds` on the arms' samples).
POWER_RUNS = 200
SIZES = (5000, 10000, 20000)


def _one_unit(values: FloatArray) -> ArmSample:
    return ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)


def _power(tol: float, seed: int) -> dict[int, tuple[float, float]]:
    rng = np.random.default_rng(seed)
    new = dict.fromkeys(SIZES, 0)
    union = dict.fromkeys(SIZES, 0)
    for _ in range(POWER_RUNS):
        base = rng.lognormal(0.0, 0.5, SIZES[-1])
        spec = 1.1 * rng.lognormal(0.0, 0.5, SIZES[-1])
        for n in SIZES:
            b, s = base[:n], spec[:n]
            new[n] += p99_slower_test(b, s, alpha=ALPHA, tolerance=tol).decision == "slower"
            lower, _upper = ratio_bounds(_one_unit(b), _one_unit(s), 0.99, ALPHA)
            union[n] += lower > 1.0 + tol
    return {n: (new[n] / POWER_RUNS, union[n] / POWER_RUNS) for n in SIZES}


@pytest.mark.slow
def test_power_beats_the_union_bound_for_a_ten_percent_p99_slowdown() -> None:
    curve = _power(0.0, seed=21)
    for n, (new, union) in curve.items():
        print(f"tol=0: n={n}/arm power new={new:.3f} union={union:.3f}")
    for n, (new, union) in curve.items():
        assert new >= union, n
    # Margin: with 200 runs the SE of a power difference is <= 0.05.
    assert curve[5000][0] - curve[5000][1] >= 0.1
    assert curve[10000][0] - curve[10000][1] >= 0.1
    curve5 = _power(0.05, seed=22)
    for n, (new, union) in curve5.items():
        print(f"tol=0.05: n={n}/arm power new={new:.3f} union={union:.3f}")
        assert new >= union, n
