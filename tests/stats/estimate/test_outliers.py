"""Outliers from histograms (`estimate.outliers`): the log-IQR fences from the histogram's
quartiles and the counts beyond them, against the exact per-request count (oracle)."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.stats.estimate.outliers import count_outliers, log_quantiles
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import GRID_LOG_WIDTH
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]
D = GRID_LOG_WIDTH


def one_unit(values: FloatArray) -> ArmSample:
    return ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)


def test_outliers_from_bins_match_the_exact_count_up_to_values_near_a_fence() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.lognormal(0.0, 0.4, 20_000), rng.lognormal(2.5, 0.1, 300)])
    want_count, want_low, want_high = oracles.count_outliers(values)
    got = count_outliers(one_unit(values))
    # the fences move by at most a bin; only values within a bin of a fence can change sides
    near = np.sum(
        (np.abs(np.log(values) - math.log(want_high)) < 2 * D)
        | (np.abs(np.log(values) - math.log(want_low)) < 2 * D)
    )
    assert abs(got.count - want_count) <= near
    assert got.count >= 300
    assert got.fraction == pytest.approx(got.count / values.size, rel=1e-12)
    assert math.log(got.high_fence) == pytest.approx(math.log(want_high), abs=4 * D)
    assert math.log(got.low_fence) == pytest.approx(math.log(want_low), abs=4 * D)
    # values spread over several units count the same as one unit
    spread = ArmSample.from_values(values, rng.integers(0, 7, values.size), 7)
    assert count_outliers(spread) == got


def test_quartiles_are_lower_order_statistics_at_bin_centres() -> None:
    values = np.random.default_rng(4).lognormal(0.0, 0.7, 4001)
    bins, counts = one_unit(values).pooled()
    got = log_quantiles(bins, counts, [0.25, 0.5, 0.75, 0.99])
    want = np.log(np.quantile(values, [0.25, 0.5, 0.75, 0.99], method="lower"))
    assert float(np.max(np.abs(got - want))) <= D / 2 + 1e-12


def test_too_few_values_count_nothing() -> None:
    few = count_outliers(one_unit(np.array([1.0, 2.0, 100.0])))
    assert few.count == 0 and few.fraction == 0.0
    assert few.to_dict() == {"count": 0, "fraction": 0.0, "low_fence": None, "high_fence": None}
    assert count_outliers(ArmSample.empty()).count == 0
    shown = count_outliers(one_unit(np.array([1.0, 1.1, 1.2, 1.3, 50.0])))
    assert shown.count == 1 and shown.to_dict()["high_fence"] == shown.high_fence
