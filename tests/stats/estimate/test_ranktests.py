from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats
from specproxy.stats.estimate.ranktests import hodges_lehmann, rank_tests


def test_hodges_lehmann_matches_brute_force() -> None:
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.3, 1, 41), rng.normal(0, 1, 30)
    diffs = np.sort(np.array([x - y for x, y in itertools.product(a, b)]))
    estimate, lo, hi = hodges_lehmann(a, b)
    assert estimate == pytest.approx(np.median(diffs), abs=1e-9)
    total = a.size * b.size
    c = int(np.floor(total / 2 - 1.959964 * np.sqrt(total * (a.size + b.size + 1) / 12)))
    assert lo == pytest.approx(diffs[c - 1], abs=1e-9)
    assert hi == pytest.approx(diffs[total - c], abs=1e-9)


def test_rank_tests_detect_a_multiplicative_speedup() -> None:
    rng = np.random.default_rng(1)
    base, spec = rng.lognormal(0, 0.4, 400), rng.lognormal(-np.log(1.3), 0.4, 400)
    out = rank_tests(base, spec, rng)
    assert out.mann_whitney_p == pytest.approx(stats.mannwhitneyu(base, spec).pvalue)
    assert out.mann_whitney_p < 1e-6
    assert out.hl_lower < 1.3 < out.hl_upper
    assert out.hl_speedup == pytest.approx(1.3, rel=0.08)


def test_rank_tests_subsample_large_arms_and_handle_empty() -> None:
    rng = np.random.default_rng(2)
    out = rank_tests(rng.lognormal(size=25_000), rng.lognormal(size=25_000), rng)
    assert out.hl_lower < 1.0 < out.hl_upper
    assert np.isnan(rank_tests(np.array([]), np.ones(3), rng).mann_whitney_p)


def test_hodges_lehmann_of_identical_constant_arms_terminates() -> None:
    # all values equal (e.g. a fixed TTFT): the bisection used to loop forever at span 0
    estimate, lower, upper = hodges_lehmann(np.full(50, 0.1), np.full(60, 0.1))
    assert abs(estimate) <= 1e-12 and lower <= estimate <= upper
