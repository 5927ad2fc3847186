"""Confidence sequences for quantiles (`anytime.sequential`): the count boundaries, one arm's
bounds from its histogram (the exact order statistics' within half a bin), and the ratio of two
arms' quantiles (a union bound, treatment / control)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.stats.anytime.sequential import count_boundaries, cs_bounds, ratio_bounds
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import GRID_ERROR_BOUND, GRID_LOG_WIDTH
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]


def one_unit(values: FloatArray) -> ArmSample:
    return ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)


def test_boundaries_bracket_the_expected_count_and_widen_with_confidence() -> None:
    k_lo, k_hi = count_boundaries(5000, 0.99, 0.025)
    assert k_lo < 0.99 * 5000 < k_hi <= 5000
    k_lo2, k_hi2 = count_boundaries(5000, 0.99, 0.001)
    assert k_lo2 < k_lo and k_hi2 > k_hi
    assert count_boundaries(50, 0.99, 0.025) == (count_boundaries(50, 0.99, 0.025)[0], 51)
    assert count_boundaries(0, 0.5, 0.05) == (0, 1)


def test_boundaries_are_wider_than_a_fixed_sample_interval() -> None:
    # anytime validity costs width: wider than the pointwise normal interval at every t
    for t in (1000, 5000, 20000):
        k_lo, k_hi = count_boundaries(t, 0.5, 0.05)
        z = 1.96 * np.sqrt(t * 0.25)
        assert k_hi - 0.5 * t > z and 0.5 * t - k_lo > z


def test_quantile_cs_covers_the_true_quantile_and_is_the_exact_one_within_half_a_bin() -> None:
    x = np.random.default_rng(0).lognormal(0, 1, 10_000)
    for p, alpha in ((0.99, 0.05), (0.5, 0.025), (0.9, 0.01)):
        lo, hi = cs_bounds(one_unit(x), p, alpha, 5000)
        exact = oracles.quantile_cs(x, p, alpha)
        assert abs(math.log(lo / exact[0])) <= GRID_LOG_WIDTH / 2 + 1e-12
        assert abs(math.log(hi / exact[1])) <= GRID_LOG_WIDTH / 2 + 1e-12
    lo, hi = cs_bounds(one_unit(x), 0.99, 0.05, 5000)
    assert lo < np.exp(2.326348) < hi
    lo, hi = cs_bounds(one_unit(x[:10]), 0.99, 0.05, 5000)
    assert lo > 0 and hi == math.inf
    assert cs_bounds(ArmSample.empty(), 0.5, 0.05, 5000) == (-math.inf, math.inf)


def test_ratio_bounds_are_the_union_of_each_arms_cs_at_half_alpha() -> None:
    rng = np.random.default_rng(3)
    base, spec = rng.lognormal(0, 0.3, 4000), rng.lognormal(0.1, 0.3, 3000)
    lower, upper = ratio_bounds(one_unit(base), one_unit(spec), 0.99, 0.05)
    b_lo, b_hi = oracles.quantile_cs(base, 0.99, 0.025)
    s_lo, s_hi = oracles.quantile_cs(spec, 0.99, 0.025)
    # treatment / control, each bound a ratio of two bin centres: within a bin of the exact one
    assert abs(lower / (s_lo / b_hi) - 1) <= GRID_ERROR_BOUND
    assert abs(upper / (s_hi / b_lo) - 1) <= GRID_ERROR_BOUND


def test_clear_p99_slowdown_and_median_speedup_are_bounded_away_from_one() -> None:
    rng = np.random.default_rng(1)
    base = one_unit(rng.lognormal(0, 0.2, 5000))
    slow = one_unit(rng.lognormal(np.log(1.3), 0.2, 5000))
    assert ratio_bounds(base, slow, 0.99, 0.05)[0] > 1.05
    fast = one_unit(rng.lognormal(np.log(0.7), 0.2, 5000))
    assert ratio_bounds(base, fast, 0.5, 0.05)[1] < 1.0
    assert ratio_bounds(base, fast, 0.99, 0.05)[0] < 1.0
    same = one_unit(rng.lognormal(0, 0.2, 5000))
    for p in (0.5, 0.99):
        lower, upper = ratio_bounds(base, same, p, 0.05)
        assert lower < 1 < upper


@pytest.mark.parametrize("n", [1, 30])
def test_tiny_samples_have_no_p99_bound(n: int) -> None:
    rng = np.random.default_rng(2)
    base, spec = one_unit(rng.lognormal(size=n)), one_unit(rng.lognormal(size=n) * 5)
    assert ratio_bounds(base, spec, 0.99, 0.05) == (0.0, math.inf)
    assert ratio_bounds(ArmSample.empty(), spec, 0.5, 0.05) == (0.0, math.inf)
