from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from scipy import stats

from specproxy.stats.estimate.bootstrap import (
    HISTOGRAM_ERROR_BOUND,
    HISTOGRAM_MEAN_ERROR_BOUND,
    LogHistogram,
    histogram_replicates,
    paired_speedup_intervals,
    percentile_interval,
    split_replicates,
    split_speedup_intervals,
)

FUNCS: dict[str, Any] = {
    "median": lambda x, axis: np.median(x, axis=axis),
    "mean": lambda x, axis: np.mean(x, axis=axis),
    "p90": lambda x, axis: np.quantile(x, 0.9, axis=axis),
}


@pytest.mark.parametrize("statistic", ["median", "mean", "p90"])
@pytest.mark.parametrize("paired", [False, True])
def test_bootstrap_agrees_with_scipy_percentile(statistic: str, paired: bool) -> None:
    rng = np.random.default_rng(1)
    base = rng.lognormal(0.0, 0.5, 150)
    spec = rng.lognormal(-0.1, 0.5, 150)
    engine = paired_speedup_intervals if paired else split_speedup_intervals
    ours = engine(base, spec, statistics=[statistic], rng=rng, resamples=20_000)[statistic]
    f = FUNCS[statistic]
    ref = stats.bootstrap(
        (base, spec),
        lambda x, y, axis: f(x, axis=axis) / f(y, axis=axis),
        method="percentile",
        n_resamples=20_000,
        paired=paired,
        vectorized=True,
        rng=np.random.default_rng(2),
    ).confidence_interval
    assert ours.estimate == pytest.approx(f(base, None) / f(spec, None))
    # two independent Monte-Carlo runs of the same bootstrap distribution
    assert ours.lower == pytest.approx(ref.low, rel=0.01)
    assert ours.upper == pytest.approx(ref.high, rel=0.01)


def test_same_seed_same_interval() -> None:
    x = np.random.default_rng(0).lognormal(size=500)
    y = np.random.default_rng(1).lognormal(size=500)
    a = split_speedup_intervals(x, y, statistics=["p99"], rng=np.random.default_rng(7))
    b = split_speedup_intervals(x, y, statistics=["p99"], rng=np.random.default_rng(7))
    assert a == b


def test_large_arms_take_the_mean_from_histograms_and_match_the_exact_engine() -> None:
    rng = np.random.default_rng(3)
    base = rng.lognormal(0.0, 0.5, 30_000)
    spec = rng.lognormal(-0.1, 0.5, 30_000)
    stats_ = ["median", "mean", "p99"]
    hist = split_speedup_intervals(base, spec, statistics=stats_, rng=rng, resamples=4000)
    exact = split_speedup_intervals(
        base, spec, statistics=stats_, rng=rng, resamples=4000, histogram_min_n=10**9
    )
    for s in stats_:
        assert hist[s].estimate == exact[s].estimate
        width = exact[s].upper - exact[s].lower
        assert abs(hist[s].lower - exact[s].lower) < 0.1 * width
        assert abs(hist[s].upper - exact[s].upper) < 0.1 * width
    # which engine draws what: quantiles exact order statistics, the mean from the histogram
    got = split_speedup_intervals(
        base, spec, statistics=stats_, rng=np.random.default_rng(5), resamples=500
    )
    again = np.random.default_rng(5)
    reps = [
        {
            **split_replicates(arm, ["median", "p99"], again, 500),
            **histogram_replicates(arm, ["mean"], again, 500),
        }
        for arm in (base, spec)
    ]
    for s in stats_:
        lower, upper = percentile_interval(reps[0][s] / reps[1][s], 0.95)
        assert (got[s].lower, got[s].upper) == (lower, upper), s


def _exact_lower_order_stat(
    sorted_x: npt.NDArray[np.float64], weights: npt.NDArray[np.int64], p: float
) -> npt.NDArray[np.float64]:
    total = weights.sum(axis=1)
    rank = np.floor((total - 1) * p)
    idx = (np.cumsum(weights, axis=1) <= rank[:, None]).sum(axis=1)
    out: npt.NDArray[np.float64] = sorted_x[idx]
    return out


@pytest.mark.parametrize("rel_width", [2e-4, 1e-2])
def test_histogram_binning_error_is_within_the_stated_bound(rel_width: float) -> None:
    """Drive the exact Poisson bootstrap and the binned one with the *same* weights."""
    rng = np.random.default_rng(4)
    x = np.sort(rng.lognormal(0.0, 0.8, 50_000))
    hist = LogHistogram.build(x, rel_width)
    weights = rng.poisson(1.0, size=(200, x.size))
    # bin of every sorted observation, to aggregate its weights like the histogram engine does
    d = np.log1p(rel_width)
    raw_bins = ((np.log(x) - np.log(x[0])) / d).astype(np.int64)
    _, bin_of = np.unique(raw_bins, return_inverse=True)
    bin_weights = np.zeros((200, hist.counts.size), dtype=np.int64)
    for r in range(200):
        bin_weights[r] = np.bincount(bin_of, weights=weights[r], minlength=hist.counts.size)
    total = bin_weights.sum(axis=1)
    # quantile: centre of the bin holding the replicate's lower order statistic
    for p in (0.5, 0.99):
        exact = _exact_lower_order_stat(x, weights, p)
        rank = np.floor((total - 1) * p)
        binned = hist.centres[(np.cumsum(bin_weights, axis=1) <= rank[:, None]).sum(axis=1)]
        assert np.max(np.abs(np.log(binned / exact))) <= d / 2 + 1e-12
    # mean: bin means instead of per-observation values
    exact_mean = (weights @ x) / weights.sum(axis=1)
    binned_mean = (bin_weights @ hist.means) / total
    assert np.max(np.abs(np.log(binned_mean / exact_mean))) <= d + 1e-12
    # and the bounds quoted for CI endpoints follow from those per-replicate factors
    assert pytest.approx(2e-4) == HISTOGRAM_ERROR_BOUND
    assert pytest.approx(np.expm1(2 * np.log1p(1e-2))) == HISTOGRAM_MEAN_ERROR_BOUND


def test_histogram_rejects_non_positive_values() -> None:
    with pytest.raises(ValueError, match="positive"):
        LogHistogram.build(np.array([1.0, 0.0]))


def test_empty_arm_gives_nan_interval() -> None:
    out = split_speedup_intervals(
        np.array([]), np.ones(5), statistics=["median"], rng=np.random.default_rng(0)
    )
    assert np.isnan(out["median"].estimate)
    with pytest.raises(ValueError, match="same length"):
        paired_speedup_intervals(
            np.ones(3), np.ones(4), statistics=["median"], rng=np.random.default_rng(0)
        )
