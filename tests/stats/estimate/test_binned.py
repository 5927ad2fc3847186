"""The row path's secondary statistics from histograms equal the row functions within the bound."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats
from specproxy.stats.clean import count_outliers
from specproxy.stats.estimate.binned import (
    binned_density_at_median,
    binned_outliers,
    binned_rank_tests,
)
from specproxy.stats.estimate.ranktests import HL_MAX_N, hodges_lehmann

from specproxy.stats import compare
from specproxy.stats.estimate import binned
from specproxy.stats.estimate.samplesize import log_density_at_median
from specproxy.summary.grid import COARSE_FACTOR, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_index, coarse_as_fine, coarse_bin, grid_histogram

IntArray = npt.NDArray[np.int64]
D = GRID_LOG_WIDTH


def _hist(values: npt.NDArray[np.float64], coarse: bool = False) -> tuple[IntArray, IntArray]:
    bins = bin_index(values)
    if coarse:
        bins = coarse_as_fine(coarse_bin(bins))
    grid, counts = np.unique(bins, return_counts=True)
    return grid.astype(np.int64), counts.astype(np.int64)


@pytest.mark.parametrize("seed", range(4))
def test_hodges_lehmann_and_moses_bounds_within_a_bin_of_the_exact_ones(seed: int) -> None:
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.0, 0.5, 3000)
    spec = rng.lognormal(-0.2 + 0.05 * seed, 0.3 + 0.1 * seed, 2000 + 500 * seed)
    want = hodges_lehmann(np.log(base), np.log(spec))
    got = binned_rank_tests(*_hist(base), *_hist(spec))
    for value, exact in zip((got.hl_speedup, got.hl_lower, got.hl_upper), want, strict=True):
        assert abs(math.log(value) - exact) <= D * (1 + 1e-9)
    coarse = binned_rank_tests(*_hist(base, coarse=True), *_hist(spec, coarse=True))
    assert abs(math.log(coarse.hl_speedup) - want[0]) <= COARSE_FACTOR * D * (1 + 1e-9)


def test_mann_whitney_equals_scipy_when_no_two_values_share_a_bin() -> None:
    rng = np.random.default_rng(7)
    # values on bin centres 3 bins apart: the histogram loses nothing, ties included
    pool = np.exp((np.arange(5000) * 3 + 0.5) * D)
    base = rng.choice(pool, 700)  # repeats: real ties, which both sides count as halves
    spec = rng.choice(pool[:4000], 500)
    got = binned_rank_tests(*_hist(base), *_hist(spec))
    want = stats.mannwhitneyu(base, spec, alternative="two-sided", method="asymptotic").pvalue
    assert got.mann_whitney_p == pytest.approx(want, rel=1e-9)
    exact = hodges_lehmann(np.log(base), np.log(spec))
    assert math.log(got.hl_speedup) == pytest.approx(exact[0], abs=1e-9)


def test_outliers_and_the_median_density_from_bins() -> None:
    rng = np.random.default_rng(3)
    values = np.concatenate([rng.lognormal(0.0, 0.4, 20_000), rng.lognormal(2.5, 0.1, 300)])
    bins, counts = _hist(values)
    want, got = count_outliers(values), binned_outliers(bins, counts)
    # the fences move by at most a bin; only values within a bin of a fence can change sides
    near = np.sum(
        (np.abs(np.log(values) - math.log(want.high_fence)) < 2 * D)
        | (np.abs(np.log(values) - math.log(want.low_fence)) < 2 * D)
    )
    assert abs(got.count - want.count) <= near
    assert got.count >= 300
    assert math.log(got.high_fence) == pytest.approx(math.log(want.high_fence), abs=4 * D)
    assert binned_density_at_median(bins, counts) == pytest.approx(
        log_density_at_median(values), rel=0.01
    )
    assert binned_outliers(bins[:1], np.array([3])).count == 0
    assert math.isnan(binned_density_at_median(bins[:1], np.array([9])))


def test_a_span_wider_than_the_dense_limit_merges_bins(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(4)
    base, spec = rng.lognormal(0.0, 0.5, 2000), rng.lognormal(-0.3, 0.5, 2000)
    exact = hodges_lehmann(np.log(base), np.log(spec))[0]
    monkeypatch.setattr(binned, "MAX_DENSE_BINS", 1000)  # ~25k bins span: merged 26 to a step
    got = binned_rank_tests(*_hist(base), *_hist(spec))
    bins = _hist(np.concatenate([base, spec]))[0]
    merge = math.ceil((int(bins[-1]) - int(bins[0]) + 1) / 1000)
    assert merge > 1
    assert abs(math.log(got.hl_speedup) - exact) <= (merge + 1) * D
    empty = binned_rank_tests(
        np.zeros(0, np.int64), np.zeros(0, np.int64), bins, np.ones_like(bins)
    )
    assert math.isnan(empty.hl_speedup) and math.isnan(empty.mann_whitney_p)


def test_the_row_path_takes_large_arms_rank_tests_from_the_grid() -> None:
    """Above `HL_MAX_N` values per arm the row path's HL is the binned one over every value:
    within a bin of the exact HL of all values (the exact code would subsample)."""
    rng = np.random.default_rng(9)
    base, spec = rng.lognormal(0.0, 0.5, HL_MAX_N + 5000), rng.lognormal(-0.15, 0.5, HL_MAX_N + 1)
    got = compare._rank_tests(base, spec, rng, 0.95)
    want = binned_rank_tests(*grid_histogram(base), *grid_histogram(spec))
    assert got == want.to_dict()
    exact = hodges_lehmann(np.log(base), np.log(spec))
    assert got["hl_speedup"] is not None and got["mann_whitney_p"] is not None
    assert abs(math.log(got["hl_speedup"]) - exact[0]) <= D * (1 + 1e-9)
    scipy_p = stats.mannwhitneyu(base, spec, alternative="two-sided", method="asymptotic").pvalue
    # ties within a bin move U a little: p ~ 1e-198 here, equal on the log scale
    assert math.log(got["mann_whitney_p"]) == pytest.approx(math.log(scipy_p), rel=1e-4)
    small = compare._rank_tests(base[:500], spec[:500], rng, 0.95)  # exact below the limit
    assert small["hl_speedup"] == pytest.approx(
        math.exp(hodges_lehmann(np.log(base[:500]), np.log(spec[:500]))[0]), rel=1e-12
    )
