from __future__ import annotations

import numpy as np
import pytest

from specproxy.stats.anytime.sequential import (
    compare_sequential,
    count_boundaries,
    quantile_confidence_sequence,
)


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


def test_quantile_cs_covers_the_true_quantile() -> None:
    x = np.random.default_rng(0).lognormal(0, 1, 10_000)
    lo, hi = quantile_confidence_sequence(x, 0.99, 0.05)
    assert lo < np.exp(2.326348) < hi
    lo, hi = quantile_confidence_sequence(x[:10], 0.99, 0.05)
    assert lo > 0 and hi == np.inf


def test_clear_p99_slowdown_and_median_speedup_are_detected() -> None:
    rng = np.random.default_rng(1)
    base = rng.lognormal(0, 0.2, 5000)
    slow = compare_sequential(base, rng.lognormal(np.log(1.3), 0.2, 5000), tolerance=0.05)
    assert slow.p99_slower and slow.verdict == "slower"
    fast = compare_sequential(base, rng.lognormal(np.log(0.7), 0.2, 5000))
    assert fast.median_faster and not fast.p99_slower and fast.verdict == "faster"
    same = compare_sequential(base, rng.lognormal(0, 0.2, 5000))
    assert same.verdict == "inconclusive"
    assert same.p99_ratio_lower < 1 < same.p99_ratio_upper
    assert same.to_dict()["verdict"] == "inconclusive"


@pytest.mark.parametrize("n", [1, 30])
def test_tiny_samples_are_inconclusive(n: int) -> None:
    rng = np.random.default_rng(2)
    out = compare_sequential(rng.lognormal(size=n), rng.lognormal(size=n) * 5)
    assert out.verdict == "inconclusive"
    assert out.to_dict()["p99_ratio_upper"] is None
