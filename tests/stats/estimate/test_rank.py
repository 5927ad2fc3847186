"""Rank tests from histograms (`estimate.rank`): Mann-Whitney and Hodges-Lehmann of two
`ArmSample`s, against the exact per-request ones (`tests.stats.oracles`) and brute force: HL and
its Moses bounds within one bin width (a difference of two values, each within half a bin of its
bin's centre), Mann-Whitney equal to scipy's asymptotic p where no two values share a bin."""

from __future__ import annotations

import itertools
import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from specproxy.stats.estimate import rank
from specproxy.stats.estimate.rank import rank_tests
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import COARSE_FACTOR, GRID_LOG_WIDTH
from specproxy.summary.histogram import coarse_as_fine, coarse_bin
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]
D = GRID_LOG_WIDTH
WITHIN_A_BIN = D * (1 + 1e-9)


def one_unit(values: FloatArray, *, coarse: bool = False) -> ArmSample:
    """The values as one time unit; `coarse`: as the compacted tier holds them (each value at
    the centre fine bin of its 0.5 % coarse bin)."""
    sample = ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)
    if not coarse:
        return sample
    bins, at = np.unique(coarse_as_fine(coarse_bin(sample.bins)), return_inverse=True)
    return ArmSample(
        units=1,
        unit=np.zeros(bins.size, dtype=np.int64),
        bins=bins.astype(np.int64),
        counts=np.bincount(at, weights=sample.counts, minlength=bins.size).astype(np.int64),
        unit_n=sample.unit_n,
        unit_sum=sample.unit_sum,
    )


@pytest.mark.parametrize("seed", range(4))
def test_hodges_lehmann_and_moses_bounds_within_a_bin_of_the_exact_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, 0.5, 3000)
    spec = rng.lognormal(-0.2 + 0.05 * seed, 0.3 + 0.1 * seed, 2000 + 500 * seed)
    want = oracles.hodges_lehmann(np.log(base), np.log(spec))
    got = rank_tests(one_unit(base), one_unit(spec))
    for value, exact in zip((got.hl_speedup, got.hl_lower, got.hl_upper), want, strict=True):
        assert abs(math.log(value) - exact) <= WITHIN_A_BIN
    coarse = rank_tests(one_unit(base, coarse=True), one_unit(spec, coarse=True))
    assert abs(math.log(coarse.hl_speedup) - want[0]) <= COARSE_FACTOR * WITHIN_A_BIN


def test_hodges_lehmann_and_moses_bounds_match_brute_force_within_a_bin() -> None:
    rng = np.random.default_rng(0)
    a, b = np.exp(rng.normal(0.3, 1, 41)), np.exp(rng.normal(0, 1, 30))
    diffs = np.sort(np.array([x - y for x, y in itertools.product(np.log(a), np.log(b))]))
    got = rank_tests(one_unit(a), one_unit(b))
    assert abs(math.log(got.hl_speedup) - float(np.median(diffs))) <= WITHIN_A_BIN
    total = a.size * b.size
    c = int(np.floor(total / 2 - 1.959964 * np.sqrt(total * (a.size + b.size + 1) / 12)))
    assert abs(math.log(got.hl_lower) - diffs[c - 1]) <= WITHIN_A_BIN
    assert abs(math.log(got.hl_upper) - diffs[total - c]) <= WITHIN_A_BIN
    # the oracle agrees with brute force exactly (it is what the other tests compare with)
    exact = oracles.hodges_lehmann(np.log(a), np.log(b))
    assert exact == pytest.approx((np.median(diffs), diffs[c - 1], diffs[total - c]), abs=1e-9)


def test_mann_whitney_equals_scipy_when_no_two_values_share_a_bin() -> None:
    rng = np.random.default_rng(7)
    # values on bin centres 3 bins apart: the histogram loses nothing, ties included
    pool = np.exp((np.arange(5000) * 3 + 0.5) * D)
    base = rng.choice(pool, 700)  # repeats: real ties, which both sides count as halves
    spec = rng.choice(pool[:4000], 500)
    got = rank_tests(one_unit(base), one_unit(spec))
    want = stats.mannwhitneyu(base, spec, alternative="two-sided", method="asymptotic").pvalue
    assert got.mann_whitney_p == pytest.approx(want, rel=1e-9)
    exact = oracles.hodges_lehmann(np.log(base), np.log(spec))
    assert math.log(got.hl_speedup) == pytest.approx(exact[0], abs=1e-9)


def test_rank_tests_detect_a_multiplicative_speedup() -> None:
    rng = np.random.default_rng(1)
    base, spec = rng.lognormal(0, 0.4, 400), rng.lognormal(-np.log(1.3), 0.4, 400)
    out = rank_tests(one_unit(base), one_unit(spec))
    p_exact, hl, lo, hi = oracles.rank_tests(base, spec)
    # values sharing a bin count as ties: U moves by half a pair per such pair, p barely
    assert math.log(out.mann_whitney_p) == pytest.approx(math.log(p_exact), rel=1e-3)
    assert out.mann_whitney_p < 1e-6
    assert out.hl_lower < 1.3 < out.hl_upper
    assert out.hl_speedup == pytest.approx(1.3, rel=0.08)
    for got, want in ((out.hl_speedup, hl), (out.hl_lower, lo), (out.hl_upper, hi)):
        assert abs(math.log(got / want)) <= WITHIN_A_BIN
    assert out.to_dict() == {
        "mann_whitney_p": out.mann_whitney_p,
        "hl_speedup": out.hl_speedup,
        "hl_lower": out.hl_lower,
        "hl_upper": out.hl_upper,
    }


def test_large_arms_use_every_value_within_a_bin_of_the_exact_rank_tests() -> None:
    """Every request counts, whatever the arms' sizes (the exact bisection used to subsample
    above 20k values per arm): HL within a bin of the exact HL of all values, Mann-Whitney's p
    equal on the log scale."""
    rng = np.random.default_rng(9)
    base, spec = rng.lognormal(0.0, 0.5, 25_000), rng.lognormal(-0.15, 0.5, 20_001)
    got = rank_tests(one_unit(base), one_unit(spec))
    p_exact, hl, lo, hi = oracles.rank_tests(base, spec)
    for value, exact in ((got.hl_speedup, hl), (got.hl_lower, lo), (got.hl_upper, hi)):
        assert abs(math.log(value / exact)) <= WITHIN_A_BIN
    # ties within a bin move U a little: p ~ 1e-198 here, equal on the log scale
    assert math.log(got.mann_whitney_p) == pytest.approx(math.log(p_exact), rel=1e-4)
    same = rank_tests(one_unit(base), one_unit(rng.lognormal(0.0, 0.5, 25_000)))
    assert same.hl_lower < 1.0 < same.hl_upper


def test_a_span_wider_than_the_dense_limit_merges_bins(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    base, spec = rng.lognormal(0.0, 0.5, 2000), rng.lognormal(-0.3, 0.5, 2000)
    exact = oracles.hodges_lehmann(np.log(base), np.log(spec))[0]
    monkeypatch.setattr(rank, "MAX_DENSE_BINS", 1000)  # ~25k bins span: merged 26 to a step
    got = rank_tests(one_unit(base), one_unit(spec))
    bins = one_unit(np.concatenate([base, spec])).pooled()[0]
    merge = math.ceil((int(bins[-1]) - int(bins[0]) + 1) / 1000)
    assert merge > 1
    assert abs(math.log(got.hl_speedup) - exact) <= (merge + 1) * D


def test_an_empty_arm_gives_nan_and_constant_arms_give_no_shift() -> None:
    rng = np.random.default_rng(2)
    full = one_unit(rng.lognormal(size=300))
    for out in (rank_tests(ArmSample.empty(), full), rank_tests(full, ArmSample.empty(3))):
        assert math.isnan(out.hl_speedup) and math.isnan(out.mann_whitney_p)
        assert out.to_dict() == dict.fromkeys(
            ("mann_whitney_p", "hl_speedup", "hl_lower", "hl_upper")
        )
    # all values equal (e.g. a fixed TTFT): every pair at lag 0, no rank information
    const = rank_tests(one_unit(np.full(50, 0.1)), one_unit(np.full(60, 0.1)))
    assert const.hl_lower == const.hl_speedup == const.hl_upper == 1.0
    assert math.isnan(const.mann_whitney_p)
