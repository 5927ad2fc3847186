"""A metric's anytime-valid evidence at one tick (`anytime.verdict.evidence`): on mirrored pairs
the union bound of the arms' confidence sequences (P99 at alpha / 2, median at alpha) and the
two-sample P99 e-process on the exact pair values; on split traffic the exceedance e-process on
the minute samples instead. Against the exact computations of the same values (oracles), and
(slow) the whole-run verdict's false alarms and power."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import numpy as np
import numpy.typing as npt
import pytest
import scipy.signal
import scipy.stats

from specproxy.stats.anytime.decision import DecisionMemory, EProcess, Evidence, fresh
from specproxy.stats.anytime.exceedance import BinnedUnits, exceedance_test, unit_counts
from specproxy.stats.anytime.p99test import p99_slower_test
from specproxy.stats.anytime.sequential import ratio_bounds
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.result import Sequential
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import GRID_ERROR_BOUND
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]
ALPHA = 0.05


def one_unit(values: FloatArray) -> ArmSample:
    return ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)


def paired(base: FloatArray, spec: FloatArray, tolerance: float) -> Evidence:
    """The evidence of a paired design: both arms' samples, and their values as the pairs."""
    return evidence(
        one_unit(base), one_unit(spec), alpha=ALPHA, tolerance=tolerance, pairs=(base, spec)
    )


def split_arms(
    rng: np.random.Generator, n: int, factor: float
) -> tuple[ArmSample, ArmSample, tuple[FloatArray, FloatArray], tuple[FloatArray, FloatArray]]:
    """2n requests over an hour, each arm a coin flip, the speculative arm `factor` x slower:
    both arms' minute samples and (values, start times)."""
    t = np.sort(rng.uniform(0.0, 3600.0, 2 * n))
    spec = rng.random(2 * n) < 0.5  # random assignment within each minute
    v = rng.lognormal(0.0, 0.5, 2 * n) * np.where(spec, factor, 1.0)
    minute = np.floor(t / 60.0).astype(np.int64)
    c = ArmSample.from_values(v[~spec], minute[~spec], 60)
    s = ArmSample.from_values(v[spec], minute[spec], 60)
    return c, s, (v[~spec], t[~spec]), (v[spec], t[spec])


def exact_evidence(
    base: tuple[FloatArray, FloatArray], spec: tuple[FloatArray, FloatArray], tolerance: float
) -> Evidence:
    """The same evidence from the exact values (oracles): order-statistic CSs, exact counts."""
    level = ALPHA / 2

    def bounds(p: float, alpha: float) -> tuple[float, float]:
        c_lo, c_hi = oracles.quantile_cs(base[0], p, alpha / 2)
        t_lo, t_hi = oracles.quantile_cs(spec[0], p, alpha / 2)
        lower = t_lo / c_hi if math.isfinite(c_hi) and t_lo > 0 else 0.0
        upper = t_hi / c_lo if c_lo > 0 and math.isfinite(t_hi) else math.inf
        return lower, upper

    tests = (
        exceedance_test(oracles.unit_counts(base, spec, tolerance=tolerance), alpha=level),
        exceedance_test(oracles.unit_counts(spec, base, tolerance=tolerance), alpha=level),
    )
    s, f = (EProcess(r.statistic, r.boundary, r.rejected) for r in tests)
    return Evidence(
        bounds(0.99, level), bounds(0.5, ALPHA), s, f, "exceedance", level, tolerance, False
    )


def test_each_test_runs_at_half_alpha_and_the_evidence_says_so() -> None:
    rng = np.random.default_rng(1)
    b, s = rng.lognormal(0.0, 0.5, 3000), rng.lognormal(0.0, 0.5, 3000)
    got = paired(b, s, 0.05)
    assert got.level == ALPHA / 2 and got.test == "two_sample" and got.binned
    assert got.slower.boundary == pytest.approx(math.log(2 / ALPHA))
    direct = p99_slower_test(b, s, alpha=ALPHA / 2, tolerance=0.05)
    assert got.slower.statistic == pytest.approx(direct.statistic)
    swapped = p99_slower_test(s, b, alpha=ALPHA / 2, tolerance=0.05)
    assert got.faster.statistic == pytest.approx(swapped.statistic)
    # the P99 ratio CS is the union bound at alpha / 2, the median's at alpha
    assert got.p99 == ratio_bounds(one_unit(b), one_unit(s), 0.99, ALPHA / 2)
    assert got.median == ratio_bounds(one_unit(b), one_unit(s), 0.5, ALPHA)
    # ... each bound a ratio of bin centres: within the grid bound of the exact order statistics
    for p, alpha, bounds in ((0.99, ALPHA / 2, got.p99), (0.5, ALPHA, got.median)):
        c_lo, c_hi = oracles.quantile_cs(b, p, alpha / 2)
        t_lo, t_hi = oracles.quantile_cs(s, p, alpha / 2)
        assert abs(bounds[0] / (t_lo / c_hi) - 1) <= GRID_ERROR_BOUND
        assert abs(bounds[1] / (t_hi / c_lo) - 1) <= GRID_ERROR_BOUND
    block = fresh(got).to_result()
    assert block["verdict"] == "inconclusive" and block["decided_by"] == []


def test_clear_slowdown_is_decided_by_both_p99_tests() -> None:
    rng = np.random.default_rng(2)
    b, s = rng.lognormal(0.0, 0.5, 5000), 1.6 * rng.lognormal(0.0, 0.5, 5000)
    block = fresh(paired(b, s, 0.05)).to_result()
    assert block["verdict"] == "slower" and block["p99_slower"]
    assert block["p99"]["verdict"] == "slower"
    assert block["p99"]["decided_by"] == ["union_bound", "two_sample"]
    assert block["decided_by"] == ["p99_union_bound", "p99_two_sample", "median"]


def test_the_two_sample_test_decides_where_the_union_bound_cannot() -> None:
    """+10 % on P99 at sigma 0.5 and 20k per arm: the product e-process rejects, the per-arm
    union bound does not (power 0.935 vs 0.715 at alpha in tests/stats/anytime/test_p99test.py)."""
    rng = np.random.default_rng(3)
    for _ in range(20):  # the first seeded draw where the two disagree (most draws)
        b, s = rng.lognormal(0.0, 0.5, 20_000), 1.1 * rng.lognormal(0.0, 0.5, 20_000)
        got = paired(b, s, 0.0)
        if got.verdicts.p99_decided_by == ["two_sample"]:
            break
    block = fresh(got).to_result()
    assert block["p99"]["verdict"] == "slower" and block["verdict"] == "slower"
    assert not block["p99"]["union_bound_slower"] and block["p99"]["slower"]["rejected"]
    statistic = block["p99"]["slower"]["statistic"]
    assert statistic is not None and statistic >= block["p99"]["slower"]["boundary"]
    assert "p99_two_sample" in block["decided_by"]


def test_faster_p99_beyond_the_tolerance_gives_a_faster_p99_verdict() -> None:
    rng = np.random.default_rng(4)
    b = rng.lognormal(0.0, 0.5, 5000)
    # same median, a much shorter tail on the speculative arm
    s = np.exp(0.5 * rng.standard_normal(5000).clip(-4.0, 1.2))
    v = paired(b, s, 0.05).verdicts
    assert v.p99 == "faster" and "two_sample" in v.p99_decided_by and v.e_faster
    assert v.verdict == "faster"


def test_split_traffic_runs_the_exceedance_test_instead_of_the_two_sample_test() -> None:
    rng = np.random.default_rng(5)
    c, s, base, spec = split_arms(rng, 8000, 1.4)
    got = evidence(c, s, alpha=ALPHA, tolerance=0.05)
    assert got.test == "exceedance" and got.level == ALPHA / 2
    counts = unit_counts(BinnedUnits.of_sample(c), BinnedUnits.of_sample(s), tolerance=0.05)
    direct = exceedance_test(counts, alpha=ALPHA / 2)
    assert got.slower.statistic == pytest.approx(direct.statistic)
    assert got.slower.boundary == pytest.approx(math.log(2 / ALPHA)) and got.slower.rejected
    # from histograms: never above the exact statistic of the same values
    exact = exact_evidence(base, spec, 0.05)
    for side in ("slower", "faster"):
        binned, want = getattr(got, side).statistic, getattr(exact, side).statistic
        assert binned is not None and want is not None and binned <= want + 1e-12
    block = fresh(got).to_result()
    p99 = block["p99"]
    assert p99.get("tests") == ["union_bound", "exceedance"]
    assert p99["verdict"] == "slower" and "exceedance" in p99["decided_by"]
    assert "p99_exceedance" in block["decided_by"] and "p99_two_sample" not in block["decided_by"]
    assert p99["slower"]["statistic"] is None and not p99["slower"]["rejected"]  # not run
    # the same samples with their pairs: the two-sample test, the exceedance test not run
    two = fresh(evidence(c, s, alpha=ALPHA, tolerance=0.05, pairs=(base[0], spec[0])))
    p99 = two.to_result()["p99"]
    assert p99.get("tests") == ["union_bound", "two_sample"]
    not_run = p99.get("exceedance_slower")
    assert not_run is not None and not_run["statistic"] is None and not not_run["rejected"]
    assert p99["slower"]["rejected"] and "two_sample" in p99["decided_by"]


def test_without_minute_units_no_e_process_runs_on_split_traffic() -> None:
    """Hour pieces (compacted rollups) or units longer than a minute: the exceedance test is
    not run at that tick (the window's memory keeps earlier crossings)."""
    rng = np.random.default_rng(6)
    c, s, _, _ = split_arms(rng, 4000, 2.0)
    for how in ({"piece_units": 60}, {"unit_s": 120.0}):
        got = evidence(
            dataclasses.replace(c, **how), dataclasses.replace(s, **how), alpha=ALPHA, tolerance=0.0
        )
        assert got.slower == got.faster == EProcess(None, math.log(2 / ALPHA), False)
        assert got.test == "exceedance" and got.verdicts.p99 == "slower"  # the union bound
    empty = evidence(c, ArmSample.empty(c.units), alpha=ALPHA, tolerance=0.0)
    assert empty.p99 == empty.median == (0.0, math.inf) and not empty.slower.rejected
    assert empty.verdicts.verdict == "inconclusive"


def test_split_verdicts_are_the_exact_ones_on_clear_cases() -> None:
    rng = np.random.default_rng(7)
    for factor, verdict in ((1.6, "slower"), (1 / 1.6, "faster"), (1.0, "inconclusive")):
        c, s, base, spec = split_arms(rng, 5000, factor)
        got = evidence(c, s, alpha=ALPHA, tolerance=0.05)
        exact = exact_evidence(base, spec, 0.05)
        assert got.verdicts.p99 == exact.verdicts.p99 == verdict
        assert got.verdicts.verdict == exact.verdicts.verdict
        for side in ("slower", "faster"):
            binned, want = getattr(got, side).statistic, getattr(exact, side).statistic
            assert binned is not None and want is not None and binned <= want + 1e-12


# ------------------------------------------------- simulations of the combined verdict (slow)
# The verdict as the running job reaches it on the whole run of a paired design: `evidence` on
# both arms' samples and the pairs' values at every look, remembered by `DecisionMemory` (the
# whole run: intersected bounds, sticky crossings). Seeded; figures printed with -s, and more of
# them (tolerance 0, sequential power) by benchmarks/bench_p99power.py.

SIGMA = 0.5
AA_RUNS = 500
AA_N = 3000  # per arm
LOOK_EVERY = 100  # samples per arm between looks
RHO = 0.3
WAVES = 10  # sinusoidal load waves over the run
WAVE_AMPLITUDE = 0.5  # on log latency: the load multiplies both arms' latency by e^(+-0.5)


def draw_arms(
    rng: np.random.Generator, setting: str, n: int, spec_log_shift: float = 0.0
) -> tuple[FloatArray, FloatArray]:
    """Both arms' latencies in arrival order: lognormal(0, SIGMA) noise that is i.i.d., AR(1)
    with rho 0.3 (marginal sd SIGMA), or i.i.d. plus a sinusoidal load wave that scales both
    arms alike at the same time (arrival times uniform, traffic split at random)."""
    arms = []
    for shift in (0.0, spec_log_shift):
        if setting == "iid":
            log = rng.normal(0.0, SIGMA, n)
        elif setting == "ar1":
            eps = rng.normal(0.0, SIGMA * math.sqrt(1.0 - RHO * RHO), n)
            eps[0] = rng.normal(0.0, SIGMA)
            log = scipy.signal.lfilter([1.0], [1.0, -RHO], eps)
        elif setting == "waves":
            t = np.sort(rng.uniform(0.0, 1.0, n))
            log = rng.normal(0.0, SIGMA, n) + WAVE_AMPLITUDE * np.sin(2 * np.pi * WAVES * t)
        else:
            raise ValueError(setting)
        arms.append(np.exp(np.asarray(log, dtype=np.float64) + shift))
    return arms[0], arms[1]


def whole_run_verdicts(
    base: FloatArray, spec: FloatArray, *, every: int, alpha: float, tolerance: float
) -> list[Sequential]:
    """The whole-run `sequential` block after each look (one every `every` per arm), both arms'
    values given as mirrored pairs."""
    memory = DecisionMemory()
    out = []
    for k in range(every, min(base.size, spec.size) + 1, every):
        b, s = base[:k], spec[:k]
        now = evidence(one_unit(b), one_unit(s), alpha=alpha, tolerance=tolerance, pairs=(b, s))
        out.append(memory.recall(("all", "all", "e2e"), now, at=float(k), span_s=None).to_result())
    return out


def false_verdicts(
    setting: str, seed: int, *, tolerance: float, runs: int = AA_RUNS
) -> Counter[str]:
    """A/A: how many runs ever showed a "slower" or a "faster" verdict."""
    rng = np.random.default_rng(seed)
    seen: Counter[str] = Counter()
    for _ in range(runs):
        base, spec = draw_arms(rng, setting, AA_N)
        looks = whole_run_verdicts(base, spec, every=LOOK_EVERY, alpha=ALPHA, tolerance=tolerance)
        verdicts = {s["verdict"] for s in looks} - {"inconclusive"}
        seen.update(verdicts)
        seen["any"] += bool(verdicts)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize(("setting", "seed"), [("iid", 31), ("ar1", 32), ("waves", 33)])
def test_aa_the_combined_verdict_raises_no_false_alarm(setting: str, seed: int) -> None:
    seen = false_verdicts(setting, seed, tolerance=0.05)
    bound = int(scipy.stats.binom.ppf(0.999, AA_RUNS, ALPHA))
    print(
        f"\nA/A {setting}: {seen['slower']} slower, {seen['faster']} faster in {AA_RUNS} runs"
        f" (look every {LOOK_EVERY} to {AA_N}/arm, alpha {ALPHA}, tol 0.05)"
    )
    assert seen["any"] <= bound  # rate <= alpha, whatever the noise (MC 99.9 % bound)
    assert seen["any"] == 0  # what the issue expects of the deployed rule at these seeds


POWER_RUNS = 200
POWER_SIZES = (5000, 10_000, 20_000)


def p99_power(seed: int, *, runs: int = POWER_RUNS) -> dict[int, dict[str, float]]:
    """+10 % P99 (speculative = 1.1 x baseline in law, lognormal sigma 0.5, tolerance 0), one
    look at each size: the share of runs each test calls "slower" ("old_union_bound": the union
    bound alone with all of alpha, the verdict before the two-sample test was wired in)."""
    rng = np.random.default_rng(seed)
    hits = {n: Counter[str]() for n in POWER_SIZES}
    for _ in range(runs):
        base, spec = draw_arms(rng, "iid", POWER_SIZES[-1], math.log(1.1))
        for n in POWER_SIZES:
            b, s = base[:n], spec[:n]
            v = paired(b, s, 0.0).verdicts
            hits[n]["union_bound"] += v.p99_union_slower
            hits[n]["two_sample"] += v.e_slower
            hits[n]["p99_verdict"] += v.p99 == "slower"
            lower, _upper = ratio_bounds(one_unit(b), one_unit(s), 0.99, ALPHA)
            hits[n]["old_union_bound"] += lower > 1.0
    return {n: {k: v / runs for k, v in c.items()} for n, c in hits.items()}


@pytest.mark.slow
def test_power_of_the_p99_verdict_for_a_ten_percent_slower_p99() -> None:
    curve = p99_power(41)
    for n, row in curve.items():
        print(
            f"\n+10% P99 sigma 0.5, n={n}/arm: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items())
        )
    # the wired verdict beats the union bound it replaces (which had all of alpha) ...
    for n in POWER_SIZES:
        assert curve[n]["p99_verdict"] >= curve[n]["old_union_bound"]
    assert curve[10_000]["p99_verdict"] - curve[10_000]["old_union_bound"] >= 0.15
    # ... and reaches the 0.8 by 20k per arm (SE of a 200-run power ~ 0.03)
    assert curve[20_000]["p99_verdict"] >= 0.8
