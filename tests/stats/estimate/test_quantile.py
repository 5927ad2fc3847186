from __future__ import annotations

import pytest

from specproxy.stats.estimate.quantile import (
    QUANTILE_LEVELS,
    STATISTICS,
    min_samples_for_quantile_ci,
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


def test_the_compared_statistics_and_their_levels() -> None:
    assert list(STATISTICS) == ["median", "mean", "p90", "p99"]
    assert QUANTILE_LEVELS == {"median": 0.5, "p90": 0.9, "p99": 0.99}
    with pytest.raises(ValueError, match="quantile level"):
        min_samples_for_quantile_ci(1.0, 0.95)
