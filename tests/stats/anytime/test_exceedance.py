"""The per-minute exceedance e-process (`anytime.exceedance`): its hypergeometric MGF, its
predictable thresholds, the counts from histograms (never above the exact e-process statistic of
the same values, `tests.stats.oracles.unit_counts`), and (slow) A/A under serial dependence and
power, through `verdict.evidence` as a window's comparison runs it."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from itertools import combinations
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import scipy.special
import scipy.stats

from specproxy.stats.anytime import exceedance
from specproxy.stats.anytime.decision import Evidence
from specproxy.stats.anytime.exceedance import (
    MIN_BASELINE,
    SETTLE_UNITS,
    BaselinePool,
    BinnedUnits,
    ExceedancePath,
    UnitCounts,
    baseline_walk,
    exceedance_test,
    hypergeom_log_mgf,
    predictable_thresholds,
    true_edges,
    unit_counts,
)
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.job.frame import Frame, arm_window
from specproxy.stats.job.rows import Rows
from specproxy.stats.sample import ArmSample
from specproxy.summary.histogram import bin_index, coarse_as_fine, coarse_bin
from tests.stats import oracles

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


def samples(
    base: Arm2, spec: Arm2, *, unit_s: float = 60.0, coarse: bool = False
) -> tuple[ArmSample, ArmSample]:
    """Both arms (values, start times in s) as a window's samples: units of `unit_s` from the
    first whole minute; `coarse`: each value at the centre of its 0.5 % bin (compacted tier)."""
    first = math.floor(min(float(base[1].min()), float(spec[1].min())) / 60.0) * 60.0
    units = int((max(float(base[1].max()), float(spec[1].max())) - first) // unit_s) + 1
    out = []
    for values, times in (base, spec):
        unit = np.floor((times - first) / unit_s).astype(np.int64)
        sample = ArmSample.from_values(values, unit, units, unit_s)
        if coarse:
            bins = coarse_as_fine(coarse_bin(sample.bins))
            key, at = np.unique(np.stack([sample.unit, bins]), axis=1, return_inverse=True)
            counts = np.bincount(at.reshape(-1), weights=sample.counts, minlength=key.shape[1])
            sample = dataclasses.replace(
                sample, unit=key[0], bins=key[1], counts=counts.astype(np.int64)
            )
        out.append(sample)
    return out[0], out[1]


def binned_counts(base: Arm2, spec: Arm2, *, tolerance: float, **how: Any) -> UnitCounts:
    """The production counts of "spec slower than base" from the arms' samples."""
    c, t = samples(base, spec, **how)
    return unit_counts(BinnedUnits.of_sample(c), BinnedUnits.of_sample(t), tolerance=tolerance)


def _units_from(arm: BinnedUnits, first: int, stop: int | None = None) -> BinnedUnits:
    """The entries of units first.. (before `stop`), renumbered from 0."""
    keep = (arm.unit >= first) & (arm.unit < (stop if stop is not None else arm.unit.max() + 1))
    return BinnedUnits(
        arm.unit[keep] - first, arm.bins[keep], arm.lower[keep], arm.upper[keep], arm.counts[keep]
    )


@pytest.mark.parametrize("cuts", [(3,), (6, 7, 15), (1, 2, 3, 4, 5, 30, 31)])
def test_feeding_the_units_in_pieces_gives_the_test_of_all_of_them(cuts: tuple[int, ...]) -> None:
    """What the guarded ramp relies on to read only new minutes: the thresholds' pool and the
    e-process's path, carried from one piece of units to the next, give bit for bit what the
    test on every unit gives (thresholds refresh inside pieces and across their borders)."""
    rng = np.random.default_rng(len(cuts))
    base, spec = minute_arms(rng, "waves", 6000, math.log(1.1))
    c, t = (BinnedUnits.of_sample(s) for s in samples(base, spec))
    units = int(max(c.unit.max(), t.unit.max())) + 1
    whole = unit_counts(c, t, tolerance=0.05)
    expected = exceedance_test(whole, alpha=ALPHA)
    pool, path = BaselinePool.empty(), ExceedancePath()
    for first, stop in zip((0, *cuts), (*cuts, units), strict=True):
        ref, tested = _units_from(c, first), _units_from(t, first)
        counts = unit_counts(ref, tested, tolerance=0.05, start=pool, units=units - first)
        # the units still to come change nothing in this piece's counts
        assert np.array_equal(counts.x[: stop - first], whole.x[first:stop])
        assert np.array_equal(counts.y[: stop - first], whole.y[first:stop])
        got = exceedance_test(counts, alpha=ALPHA, start=path)
        assert (got.statistic, got.units, got.exceedances) == (
            expected.statistic,
            expected.units,
            expected.exceedances,
        )
        path = path.extended(counts, stop - first)
        _q, pool = baseline_walk(
            ref.unit, ref.bins, ref.counts, units - first, pool, keep=stop - first
        )
    assert expected.units > max(cuts) and path.units == units
    # a pool is every value before its unit, whatever was pooled lazily by then
    whole_pool = baseline_walk(c.unit, c.bins, c.counts, units, keep=units)[1]
    assert np.array_equal(pool.pooled, whole_pool.pooled) and pool.n == int(c.counts.sum())


def test_a_clear_slowdown_is_rejected_and_the_faster_direction_is_not() -> None:
    rng = np.random.default_rng(2)
    base, spec = minute_arms(rng, "iid", 10_000, math.log(1.3))
    slower = exceedance_test(binned_counts(base, spec, tolerance=0.05), alpha=ALPHA / 2)
    faster = exceedance_test(binned_counts(spec, base, tolerance=0.05), alpha=ALPHA / 2)
    assert slower.rejected and slower.statistic >= slower.boundary
    assert not faster.rejected
    assert slower.exceedances[0] > slower.exceedances[1] > 0


def test_the_last_units_are_left_out_and_tolerance_raises_the_bar() -> None:
    """The current minute and the one before still receive rows of running requests."""
    rng = np.random.default_rng(3)
    base, spec = minute_arms(rng, "iid", 5000, math.log(1.1))
    counts = binned_counts(base, spec, tolerance=0.0)
    result = exceedance_test(counts, alpha=ALPHA)
    assert SETTLE_UNITS == 2 and result.units == counts.x.size - 2
    assert result.exceedances == (int(counts.x[:-2].sum()), int(counts.y[:-2].sum()))
    # the statistic ignores what happens in the settling minutes
    late = dataclasses.replace(counts, x=counts.x.copy())
    late.x[-2:] += 50
    assert exceedance_test(late, alpha=ALPHA).statistic == result.statistic
    # a tolerance as large as the effect removes speculative exceedances, not baseline ones
    tolerant = binned_counts(base, spec, tolerance=0.2)
    assert tolerant.x.sum() < counts.x.sum() and tolerant.y.sum() == counts.y.sum()
    with pytest.raises(ValueError, match="alpha"):
        exceedance_test(counts, alpha=1.0)


@pytest.mark.parametrize("coarse", [False, True])
@pytest.mark.parametrize("tolerance", [0.0, 0.05])
def test_counts_from_histograms_are_conservative(coarse: bool, tolerance: float) -> None:
    """Against the exact counts of the same values (oracle; the same thresholds: both from the
    reference arm's coarse bins), X from histograms (fine bins, or 0.5 % bins as in the
    compacted tier) is never above and Y never below, so the binned statistic is never above
    the exact one, in both directions."""
    rng = np.random.default_rng(4)
    base, spec = minute_arms(rng, "ar1", 8000, math.log(1.15))
    for ref, tested in ((base, spec), (spec, base)):
        binned = binned_counts(ref, tested, tolerance=tolerance, coarse=coarse)
        exact = oracles.unit_counts(ref, tested, tolerance=tolerance)
        np.testing.assert_array_equal(binned.n_test, exact.n_test)
        np.testing.assert_array_equal(binned.n_ref, exact.n_ref)
        assert np.all(binned.x <= exact.x) and np.all(binned.y >= exact.y)
        assert exact.x.sum() - binned.x.sum() < 0.05 * exact.x.sum() + 5  # close, not empty
        lower = exceedance_test(binned, alpha=ALPHA).statistic
        assert lower <= exceedance_test(exact, alpha=ALPHA).statistic
    slower = exceedance_test(
        binned_counts(base, spec, tolerance=tolerance, coarse=coarse), alpha=ALPHA
    )
    assert slower.statistic > 0


def test_units_shorter_than_a_minute_count_by_the_minute() -> None:
    """A row window's units divide a minute: its entries count in their minute, as rollups'."""
    rng = np.random.default_rng(5)
    base, spec = minute_arms(rng, "iid", 3000, math.log(1.2))
    minute = binned_counts(base, spec, tolerance=0.05)
    for unit_s in (15.0, 30.0):
        finer = binned_counts(base, spec, tolerance=0.05, unit_s=unit_s)
        for field in ("n_test", "n_ref", "x", "y"):
            np.testing.assert_array_equal(getattr(finer, field), getattr(minute, field))
    c, _ = samples(base, spec)
    for bad in (dataclasses.replace(c, unit_s=120.0), dataclasses.replace(c, unit_s=7.0)):
        with pytest.raises(ValueError, match="divide a minute"):
            BinnedUnits.of_sample(bad)
    with pytest.raises(ValueError, match="divide a minute"):
        BinnedUnits.of_sample(dataclasses.replace(c, piece_units=60))


def test_every_value_lies_within_its_entrys_true_edges() -> None:
    values = np.random.default_rng(6).lognormal(0.0, 2.0, 20_000)
    fine = bin_index(values)
    for bins in (fine, coarse_as_fine(coarse_bin(fine))):
        lower, upper = true_edges(bins)
        assert bool(np.all(lower <= values)) and bool(np.all(values < upper))
    empty = unit_counts(
        BinnedUnits.of_sample(ArmSample.empty()),
        BinnedUnits.of_sample(ArmSample.empty()),
        tolerance=0.0,
    )
    assert empty.x.size == 0
    assert exceedance_test(empty, alpha=ALPHA).statistic == -math.inf


# ------------------------------------------------------------------ simulations (slow)

AA_RUNS = 500
AA_N = 5000  # per arm; a look at every minute's end (about 100 per arm)
AA_BOUND = 40  # of 500: P(Binomial(500, 0.05) > 40) < 0.01


def claims(base: Arm2, spec: Arm2, tolerance: float = 0.0) -> dict[str, tuple[bool, bool]]:
    """(slower, faster) rejections at one look of each P99 test at alpha / 2 and of both P99
    verdicts, as `verdict.evidence` gives them to a window: split traffic's (union bound +
    exceedance, on the arms' minute samples) and mirrored pairs' (union bound + two-sample, on
    the same samples with the exact values as pairs). The exceedance test's are over every
    minute."""
    c, t = samples(base, spec)
    split = evidence(c, t, alpha=ALPHA, tolerance=tolerance)
    pairs = evidence(c, t, alpha=ALPHA, tolerance=tolerance, pairs=(base[0], spec[0]))
    assert split.test == "exceedance" and pairs.test == "two_sample"
    return {
        "exceedance": (split.slower.rejected, split.faster.rejected),
        "two-sample": (pairs.slower.rejected, pairs.faster.rejected),
        "union": (split.verdicts.p99_union_slower, split.verdicts.p99_union_faster),
        "verdict union+exceedance": _p99(split),
        "verdict union+two-sample": _p99(pairs),
    }


def _p99(e: Evidence) -> tuple[bool, bool]:
    return e.verdicts.p99 == "slower", e.verdicts.p99 == "faster"


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
    exceedance test (alpha / 2, from the minute samples as `evidence` runs it) has rejected by
    n per arm (a look at every minute)."""
    rng = np.random.default_rng(seed)
    hits = dict.fromkeys(POWER_SIZES, 0)
    for _ in range(runs):
        base, spec = minute_arms(rng, "iid", POWER_SIZES[-1], math.log(1.1))
        for n in POWER_SIZES:
            b, s = first_n(base, spec, n)
            c, t = samples(b, s)
            hits[n] += evidence(c, t, alpha=ALPHA, tolerance=0.0).slower.rejected
    return {n: h / runs for n, h in hits.items()}


@pytest.mark.slow
def test_power_for_a_ten_percent_slower_p99() -> None:
    got = power(seed=20, runs=100)
    print(f"\npower +10% P99 sigma 0.5: {got}")
    assert got[20_000] >= 0.5 and got[5000] <= got[10_000] <= got[20_000]


def _row_window(base: Arm2, spec: Arm2, unit_s: float) -> tuple[ArmSample, ArmSample]:
    """Both arms' e2e samples of the whole run as the job plans a short run from its rows
    (`Rows.tiers` in units of `unit_s`, `Frame.plan`, `arm_window`)."""

    def arrays(values: FloatArray, times: FloatArray) -> dict[str, npt.NDArray[Any]]:
        n = values.size
        nothing = np.full(n, np.nan)
        return {
            "t_start": times,
            "model": np.full(n, "m", dtype=object),
            "shadow": np.zeros(n, dtype=bool),
            "pair_id": np.full(n, None, dtype=object),
            "e2e_s": values,
            **{c: nothing for c in ("ttft_s", "tpot_s", "mean_gap_s")},
            "prompt_tokens": nothing,
            "output_tokens": nothing,
        }

    rows = Rows({"baseline": arrays(*base), "speculative": arrays(*spec)})
    tiers = rows.tiers(unit_s, lambda model: model)
    plan = Frame.of(tiers, None, now=1e10).plan(tiers, None)
    return (
        arm_window(tiers, plan, "baseline", set(), None).sample("e2e"),
        arm_window(tiers, plan, "speculative", set(), None).sample("e2e"),
    )


@pytest.mark.parametrize("start_s", [0.0, 45.0])
def test_a_row_window_counts_the_clock_minutes(start_s: float) -> None:
    """A short run planned from its rows in 15-s units: the exceedance test's minutes are the
    clock minutes of the exact counts (oracle), as the rows module promises ("units never
    straddle a minute (the exceedance test counts minutes)")."""
    rng = np.random.default_rng(8)
    base, spec = minute_arms(rng, "iid", 3000, math.log(1.2))
    base, spec = (base[0], base[1] + start_s), (spec[0], spec[1] + start_s)
    c, t = _row_window(base, spec, 15.0)
    binned = unit_counts(BinnedUnits.of_sample(c), BinnedUnits.of_sample(t), tolerance=0.05)
    exact = oracles.unit_counts(base, spec, tolerance=0.05)
    assert binned.n_ref.tolist() == exact.n_ref.tolist()
    assert binned.n_test.tolist() == exact.n_test.tolist()
    assert np.all(binned.x <= exact.x) and np.all(binned.y >= exact.y)
