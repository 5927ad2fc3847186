"""The fixed log grid: bins are fixed intervals, centres within half a bin, bad values refused,
and the scalar bin (the store's) is the vector one (the statistics')."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import GRID_ERROR_BOUND, GRID_LOG_WIDTH, GRID_REL_WIDTH, bin_of
from specproxy.summary.histogram import (
    bin_centres,
    bin_index,
    bin_log_centres,
    bin_lower_edges,
    grid_histogram,
)


def test_values_fall_in_their_bin_and_centres_are_within_half_a_bin() -> None:
    rng = np.random.default_rng(0)
    values = rng.lognormal(0.0, 3.0, 10_000)
    bins = bin_index(values)
    lower = bin_lower_edges(bins)
    assert bool(np.all(lower <= values * (1 + 1e-12)))
    assert bool(np.all(values < bin_lower_edges(bins + 1) * (1 + 1e-12)))
    assert float(np.max(np.abs(np.log(values / bin_centres(bins))))) <= GRID_LOG_WIDTH / 2 + 1e-9


def test_the_grid_does_not_depend_on_the_data() -> None:
    a = bin_index(np.array([0.25, 1.0, 3.5]))
    b = bin_index(np.array([3.5, 1e-3, 0.25, 1.0]))
    assert a.tolist() == [b[2], b[3], b[0]]
    assert a[1] == 0  # 1 s is the lower edge of bin 0


def test_the_bound_is_one_bin_and_every_sample_is_on_this_grid() -> None:
    """A ratio of two bin centres is within one bin (0.02 %) of the ratio of the values, and a
    window's sample from rows (`ArmSample.from_values`) bins them as the store's writer does
    (`summary.minute` writes `grid_histogram`)."""
    assert GRID_REL_WIDTH == 2e-4
    assert math.isclose(GRID_ERROR_BOUND, math.expm1(GRID_LOG_WIDTH))
    assert math.isclose(GRID_ERROR_BOUND, GRID_REL_WIDTH)
    values = np.random.default_rng(1).lognormal(0.0, 1.0, 5000)
    sample = ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)
    bins, counts = grid_histogram(values)
    pooled = sample.pooled()
    assert pooled[0].tolist() == bins.tolist() and pooled[1].tolist() == counts.tolist()
    assert sample.grid_error == GRID_ERROR_BOUND


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_non_positive_or_non_finite_values_are_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="strictly positive"):
        bin_index(np.array([1.0, bad]))


def test_grid_histogram_counts_each_value_in_its_bin_in_bin_order() -> None:
    centre = float(bin_centres(np.array([5000]))[0])  # ~2.7 s; a quarter bin off stays inside
    values = np.array([centre, 1e-3, centre * (1 + GRID_REL_WIDTH / 4), 1e-3, 50.0, 1e-3])
    bins, counts = grid_histogram(values)
    assert bins.dtype == np.int64 and counts.dtype == np.int64
    assert bins.tolist() == sorted(set(bin_index(values).tolist()))
    assert counts.tolist() == [3, 2, 1]  # 1e-3 three times, then bin 5000 twice
    assert np.allclose(np.exp(bin_log_centres(bins)), bin_centres(bins))


def _edge_values() -> np.ndarray:
    """The float nearest each of many bin edges exp(k d), and its 4 ulp neighbours either side."""
    k = np.concatenate([np.arange(-60_000, 60_000, 7), np.arange(-200, 200)])
    edges = np.exp(k * GRID_LOG_WIDTH)
    out = [edges]
    up, down = edges.copy(), edges.copy()
    for _ in range(4):
        up, down = np.nextafter(up, np.inf), np.nextafter(down, 0.0)
        out += [up, down]
    return np.concatenate(out)


def test_scalar_and_vector_bins_agree_on_edges_ulp_neighbours_and_random_values() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate(
        [_edge_values(), np.exp(rng.uniform(-20, 20, 200_000)), [1.0, 2.0**-30, 1e-100, 1e100]]
    )
    vector = bin_index(values).tolist()
    assert vector == [bin_of(v) for v in values.tolist()]
    assert bin_of(1.0) == 0 and bin_of(math.nextafter(1.0, 0.0)) == -1


@pytest.mark.parametrize("bad", [0.0, -1.0, math.inf, math.nan])
def test_the_scalar_bin_refuses_what_the_vector_one_refuses(bad: float) -> None:
    with pytest.raises(ValueError, match="strictly positive"):
        bin_of(bad)
