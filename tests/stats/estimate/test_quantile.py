from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from specproxy.stats.estimate.quantile import (
    min_samples_for_quantile_ci,
    point_statistic,
    samples_needed,
)


def test_p99_needs_368_samples_for_a_two_sided_95_percent_ci() -> None:
    assert min_samples_for_quantile_ci(0.99, 0.95) == 368
    assert min_samples_for_quantile_ci(0.5, 0.95) == 6


def test_order_statistic_ci_exists_exactly_from_the_minimum_n() -> None:
    # equal-tailed: P(x_(n) < Q(0.99)) = 0.99^n must be <= 2.5 %, and so must 0.01^n
    for n, exists in ((367, False), (368, True)):
        assert (0.99**n <= 0.025 and 0.01**n <= 0.025) is exists


def test_samples_needed_counts_down_to_zero() -> None:
    assert samples_needed("p99", 300, 0.95) == 68
    assert samples_needed("p99", 368, 0.95) == 0
    assert samples_needed("mean", 1, 0.95) == 1


def test_point_statistic_matches_numpy() -> None:
    x = np.random.default_rng(0).lognormal(size=101)
    assert point_statistic(x, "p90") == pytest.approx(np.quantile(x, 0.9))
    assert point_statistic(x, "mean") == pytest.approx(x.mean())
    assert point_statistic(x, "median") == pytest.approx(stats.scoreatpercentile(x, 50))
    assert np.isnan(point_statistic(np.array([]), "median"))
