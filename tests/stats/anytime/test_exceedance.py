"""The per-minute exceedance e-process (`stats.exceedance`): its hypergeometric MGF, its
predictable thresholds, conservative rollup counts, and (slow) A/A under serial dependence and
power."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from itertools import combinations

import numpy as np
import numpy.typing as npt
import pytest
import scipy.special
import scipy.stats

from specproxy.stats.anytime import exceedance
from specproxy.stats.anytime.exceedance import (
    MIN_BASELINE,
    SETTLE_UNITS,
    BinnedUnits,
    UnitCounts,
    exceedance_test,
    hypergeom_log_mgf,
    predictable_thresholds,
    unit_counts,
    unit_counts_binned,
)
from specproxy.stats.anytime.verdict import anytime_valid
from specproxy.summary.histogram import bin_index, bin_lower_edges

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Arm2 = tuple[FloatArray, FloatArray]  # (values, start times in s)
ALPHA = 0.05


@pytest.mark.parametrize(("total", "marked", "drawn"), [(7, 3, 4), (9, 0, 5), (6, 6, 2), (8, 5, 7)])
def test_the_hypergeometric_mgf_matches_brute_force_enumeration(
    total: int, marked: int, drawn: int
) -> None:
    lams = np.array([0.0, 0.3, 1.0, 2.0])
    population = [1] * marked + [0] * (total - marked)
    draws = [sum(c) for c in combinations(population, drawn)]  # every subset equally likely
    expected = [math.log(sum(math.exp(lam * h) for h in draws) / len(draws)) for lam in lams]
    got = hypergeom_log_mgf(np.array([total]), np.array([marked]), np.array([drawn]), lams)
    assert got.shape == (1, 4)
    assert got[0] == pytest.approx(expected, abs=1e-9)


def test_wide_supports_use_the_binomial_bound_which_is_above_the_exact_mgf(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Hoeffding's convex-order bound keeps each factor's mean <= 1: it may only be larger."""
    lams = np.asarray(exceedance.LAMBDAS, dtype=np.float64)
    cases = (np.array([1000, 5000, 20000]), np.array([30, 400, 9000]), np.array([500, 2600, 7000]))
    exact = hypergeom_log_mgf(*cases, lams)
    monkeypatch.setattr(exceedance, "_EXACT_SUPPORT_MAX", 0)  # every unit counts as wide
    bound = hypergeom_log_mgf(*cases, lams)
    assert np.all(bound >= exact - 1e-12)
    p = cases[1] / cases[0]
    assert bound == pytest.approx(cases[2][:, None] * np.log1p(p[:, None] * np.expm1(lams)))
    # mixed narrow and wide units: each row is what it would be alone
    monkeypatch.setattr(exceedance, "_EXACT_SUPPORT_MAX", 1000)
    mixed = hypergeom_log_mgf(*cases, lams)
    assert mixed[0] == pytest.approx(exact[0]) and mixed[2] == pytest.approx(bound[2])


def test_a_busy_minute_is_summed_exactly() -> None:
    """1k req/s per arm: 120k requests and ~2.4k exceedances in a minute stay exact (the
    binomial bound would give away tens of nats per minute at the bets that matter)."""
    lams = np.asarray(exceedance.LAMBDAS, dtype=np.float64)
    total, marked, drawn = 120_000, 2_400, 60_000
    k = np.arange(marked + 1)
    logpmf = scipy.stats.hypergeom.logpmf(k, total, marked, drawn)
    expected = [float(scipy.special.logsumexp(logpmf + lam * k)) for lam in lams]
    got = hypergeom_log_mgf(np.array([total]), np.array([marked]), np.array([drawn]), lams)
    assert got[0] == pytest.approx(expected, rel=1e-9)
    binomial = drawn * np.log1p(marked / total * np.expm1(lams))
    assert binomial[3] - got[0][3] > 50  # what the bound would cost at lam 0.5


def test_under_the_sharp_null_each_factor_has_mean_one() -> None:
    """Every labelling of one unit equally likely: E[exp(lam X - psi)] = 1 exactly, and the
    e-value of every single labelling is what `exceedance_test` multiplies in."""
    total, drawn, marked, lam = 8, 3, 4, 1.0
    psi = float(
        hypergeom_log_mgf(
            np.array([total]), np.array([marked]), np.array([drawn]), np.array([lam])
        )[0, 0]
    )
    values = [
        math.exp(lam * sum(1 for i in labels if i < marked) - psi)
        for labels in combinations(range(total), drawn)
    ]
    assert sum(values) / len(values) == pytest.approx(1.0, abs=1e-12)


def test_thresholds_depend_only_on_earlier_units() -> None:
    rng = np.random.default_rng(1)
    unit = np.repeat(np.arange(20), 200)
    v = rng.lognormal(0.0, 0.5, unit.size)
    key, counts = np.unique(np.stack([unit, bin_index(v)]), axis=1, return_counts=True)
    q = predictable_thresholds(key[0], key[1], counts.astype(np.int64), 20)
    assert np.all(np.isnan(q[: MIN_BASELINE // 200]))  # no threshold before 1000 values
    assert np.all(np.isfinite(q[MIN_BASELINE // 200 :]))
    # changing unit 12 and later leaves q_0..q_12 alone
    v2 = v.copy()
    v2[unit >= 12] *= 3.0
    key2, counts2 = np.unique(np.stack([unit, bin_index(v2)]), axis=1, return_counts=True)
    q2 = predictable_thresholds(key2[0], key2[1], counts2.astype(np.int64), 20)
    np.testing.assert_array_equal(q2[:13], q[:13])
    assert not np.array_equal(q2[13:], q[13:])
    # q_u is a grid edge near the pooled P99 of earlier units
    pooled = np.sort(v[unit < 19])
    assert q[19] == pytest.approx(pooled[math.ceil(0.99 * pooled.size) - 1], rel=2e-3)


def minute_arms(
    rng: np.random.Generator,
    setting: str,
    n_per_arm: int,
    log_shift: float = 0.0,
    per_minute: int = 200,
) -> tuple[tuple[FloatArray, FloatArray], tuple[FloatArray, FloatArray]]:
    """(baseline, speculative), each (latencies, start times in s) up to the time the first arm
    reaches `n_per_arm` (the other has at most as many), lognormal(0, SIGMA) per
    request; the arm of each request is a coin flip within its minute (probability 1/2 for
    "iid"; elsewhere a split that drifts from minute to minute, 0.5 +- 0.25). Shared by both arms:
    "ar1": per-minute AR(1) noise on log latency, rho 0.3, sd MINUTE_SD; "waves": a sinusoidal
    load wave (amplitude MINUTE_SD, one period per 40 minutes) scaling both arms, plus that
    AR(1) noise."""
    minutes = math.ceil(2.6 * n_per_arm / per_minute) + 2  # the split may favour one arm
    level = np.zeros(minutes)
    share = np.full(minutes, 0.5)
    if setting != "iid":
        eps = rng.normal(0.0, MINUTE_SD * math.sqrt(1 - RHO**2), minutes)
        level[0] = rng.normal(0.0, MINUTE_SD)
        for u in range(1, minutes):
            level[u] = RHO * level[u - 1] + eps[u]
        phase = rng.uniform(0, 2 * math.pi)
        share = 0.5 + 0.25 * np.sin(2 * math.pi * np.arange(minutes) / 23.0 + phase)
    if setting == "waves":
        level += MINUTE_SD * np.sin(2 * math.pi * np.arange(minutes) / 40.0)
    minute = np.repeat(np.arange(minutes), per_minute)
    t = minute * 60.0 + np.tile(np.arange(per_minute), minutes) * (60.0 / per_minute)
    spec = rng.random(minute.size) < share[minute]
    log = rng.normal(0.0, SIGMA, minute.size) + level[minute] + log_shift * spec
    v = np.exp(log)
    end = min(t[np.flatnonzero(mask)[n_per_arm - 1]] for mask in (~spec, spec))
    b, s = ~spec & (t <= end), spec & (t <= end)
    return (v[b], t[b]), (v[s], t[s])


SIGMA = 0.5
RHO = 0.3
MINUTE_SD = 0.5


def test_a_clear_slowdown_is_rejected_and_the_faster_direction_is_not() -> None:
    rng = np.random.default_rng(2)
    base, spec = minute_arms(rng, "iid", 10_000, math.log(1.3))
    slower = exceedance_test(unit_counts(base, spec, tolerance=0.05), alpha=ALPHA / 2)
    faster = exceedance_test(unit_counts(spec, base, tolerance=0.05), alpha=ALPHA / 2)
    assert slower.rejected and slower.statistic >= slower.boundary
    assert not faster.rejected
    assert slower.exceedances[0] > slower.exceedances[1] > 0


def test_the_last_units_are_left_out_and_tolerance_raises_the_bar() -> None:
    """The current minute and the one before still receive rows of running requests."""
    rng = np.random.default_rng(3)
    base, spec = minute_arms(rng, "iid", 5000, math.log(1.1))
    counts = unit_counts(base, spec, tolerance=0.0)
    result = exceedance_test(counts, alpha=ALPHA)
    assert SETTLE_UNITS == 2 and result.units == counts.x.size - 2
    assert result.exceedances == (int(counts.x[:-2].sum()), int(counts.y[:-2].sum()))
    # the statistic ignores what happens in the settling minutes
    late = dataclasses.replace(counts, x=counts.x.copy())
    late.x[-2:] += 50
    assert exceedance_test(late, alpha=ALPHA).statistic == result.statistic
    # a tolerance as large as the effect removes speculative exceedances, not baseline ones
    tolerant = unit_counts(base, spec, tolerance=0.2)
    assert tolerant.x.sum() < counts.x.sum() and tolerant.y.sum() == counts.y.sum()


def _binned(values: FloatArray, times: FloatArray, width: int) -> BinnedUnits:
    """Per-minute histogram entries, bins `width` fine bins wide (25: the compacted tier)."""
    unit = np.floor(times / 60.0).astype(np.int64)
    fine = bin_index(values)
    coarse = np.floor_divide(fine, width)
    key, counts = np.unique(np.stack([unit, coarse]), axis=1, return_counts=True)
    return BinnedUnits(
        unit=key[0],
        bins=key[1] * width + width // 2,
        lower=bin_lower_edges(key[1] * width) * (1 - 1e-9),
        upper=bin_lower_edges((key[1] + 1) * width) * (1 + 1e-9),
        counts=counts.astype(np.int64),
    )


@pytest.mark.parametrize("width", [1, 25])
def test_rollup_counts_are_conservative(width: int) -> None:
    """Against the exact counts of the same values at the same thresholds, X from histograms
    (fine bins, or 0.5 % bins as in the compacted tier) is never above and Y never below, so
    the binned statistic is never above the exact one."""
    rng = np.random.default_rng(4)
    base, spec = minute_arms(rng, "ar1", 8000, math.log(1.15))
    units = int(max(base[1].max(), spec[1].max()) // 60) + 1
    b_entries, s_entries = _binned(*base, width), _binned(*spec, width)
    binned = unit_counts_binned(b_entries, s_entries, tolerance=0.05)
    q = predictable_thresholds(b_entries.unit, b_entries.bins, b_entries.counts, units)
    b_u, s_u = (np.floor(t / 60.0).astype(np.int64) for t in (base[1], spec[1]))
    with np.errstate(invalid="ignore"):
        exact = UnitCounts(
            n_test=np.bincount(s_u, minlength=units).astype(np.int64),
            n_ref=np.bincount(b_u, minlength=units).astype(np.int64),
            x=np.bincount(s_u[spec[0] / 1.05 > q[s_u]], minlength=units).astype(np.int64),
            y=np.bincount(b_u[base[0] > q[b_u]], minlength=units).astype(np.int64),
        )
    np.testing.assert_array_equal(binned.n_test, exact.n_test)
    np.testing.assert_array_equal(binned.n_ref, exact.n_ref)
    assert np.all(binned.x <= exact.x) and np.all(binned.y >= exact.y)
    lower = exceedance_test(binned, alpha=ALPHA).statistic
    assert 0 < lower <= exceedance_test(exact, alpha=ALPHA).statistic


# ------------------------------------------------------------------ simulations (slow)

AA_RUNS = 500
AA_N = 5000  # per arm; a look at every minute's end (about 100 per arm)
AA_BOUND = 40  # of 500: P(Binomial(500, 0.05) > 40) < 0.01


def claims(base: Arm2, spec: Arm2, tolerance: float = 0.0) -> dict[str, tuple[bool, bool]]:
    """(slower, faster) rejections at one look of each P99 test at alpha / 2 and of both
    verdicts: split traffic's (union bound + exceedance, as wired) and the i.i.d. one (union
    bound + two-sample, what mirrored pairs get). The exceedance test's are over every minute."""
    times = (base[1], spec[1])
    split = anytime_valid(base[0], spec[0], alpha=ALPHA, tolerance=tolerance, times=times)["p99"]
    iid = anytime_valid(base[0], spec[0], alpha=ALPHA, tolerance=tolerance)["p99"]
    exc_s, exc_f = split.get("exceedance_slower"), split.get("exceedance_faster")
    assert exc_s is not None and exc_f is not None
    return {
        "exceedance": (exc_s["rejected"], exc_f["rejected"]),
        "two-sample": (iid["slower"]["rejected"], iid["faster"]["rejected"]),
        "union": (split["union_bound_slower"], split["union_bound_faster"]),
        "verdict union+exceedance": (split["verdict"] == "slower", split["verdict"] == "faster"),
        "verdict union+two-sample": (iid["verdict"] == "slower", iid["verdict"] == "faster"),
    }


def false_alarms(setting: str, seed: int, runs: int = AA_RUNS) -> Counter[str]:
    """A/A, tolerance 0: runs with a slower or faster claim, per test and verdict (`claims`;
    all but the exceedance test at the last look alone, fewer than over all looks)."""
    rng = np.random.default_rng(seed)
    seen: Counter[str] = Counter()
    for _ in range(runs):
        base, spec = minute_arms(rng, setting, AA_N)
        seen.update(k for k, v in claims(base, spec).items() if any(v))
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(("setting", "seed"), [("iid", 10), ("ar1", 11), ("waves", 12)])
def test_aa_false_alarms_stay_below_alpha_under_serial_dependence(setting: str, seed: int) -> None:
    """Asserted: the exceedance test (its level is proven); printed: the others (the i.i.d.
    tests' levels are not, and the two-sample test exceeds alpha here)."""
    seen = false_alarms(setting, seed)
    print(f"\nA/A {setting} ({AA_RUNS} runs): " + ", ".join(f"{k} {v}" for k, v in seen.items()))
    assert seen["exceedance"] <= AA_BOUND


POWER_SIZES = (5000, 10_000, 20_000)


def first_n(base: Arm2, spec: Arm2, n: int) -> tuple[Arm2, Arm2]:
    """Both arms (values, times) up to the time the first of them reaches n values."""
    end = min(base[1][n - 1], spec[1][n - 1]) if min(base[1].size, spec[1].size) > n else math.inf
    return (
        (base[0][base[1] <= end], base[1][base[1] <= end]),
        (spec[0][spec[1] <= end], spec[1][spec[1] <= end]),
    )


def power(seed: int, runs: int) -> dict[int, float]:
    """+10 % in law (P99 +10 %) at sigma 0.5, i.i.d., tolerance 0: share of runs whose
    exceedance test (alpha / 2) has rejected by n per arm (a look at every minute)."""
    rng = np.random.default_rng(seed)
    hits = dict.fromkeys(POWER_SIZES, 0)
    for _ in range(runs):
        base, spec = minute_arms(rng, "iid", POWER_SIZES[-1], math.log(1.1))
        for n in POWER_SIZES:
            b, s = first_n(base, spec, n)
            hits[n] += exceedance_test(unit_counts(b, s, tolerance=0.0), alpha=ALPHA / 2).rejected
    return {n: h / runs for n, h in hits.items()}


@pytest.mark.slow
def test_power_for_a_ten_percent_slower_p99() -> None:
    got = power(seed=20, runs=100)
    print(f"\npower +10% P99 sigma 0.5: {got}")
    assert got[20_000] >= 0.5 and got[5000] <= got[10_000] <= got[20_000]
