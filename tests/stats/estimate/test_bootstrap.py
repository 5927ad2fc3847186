"""The bootstrap's shared parts (`estimate.bootstrap`): percentile bounds, `Interval`, and the
paired design's engine (one resample of pair indices for both arms, numpy's linear quantile of
each replicate). Split traffic's intervals are `blockboot`'s (test_blockboot.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from specproxy.stats.estimate import bootstrap
from specproxy.stats.estimate.bootstrap import (
    Interval,
    paired_replicates,
    paired_speedup_intervals,
    percentile_interval,
)
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS, STATISTICS
from tests.stats import oracles


@pytest.mark.parametrize("statistic", ["median", "mean", "p90"])
def test_paired_bootstrap_agrees_with_scipy_percentile(statistic: str) -> None:
    rng = np.random.default_rng(1)
    base = rng.lognormal(0.0, 0.5, 150)
    spec = base * rng.lognormal(-0.1, 0.3, 150)  # pairs: the same requests on both arms
    ours = paired_speedup_intervals(base, spec, statistics=[statistic], rng=rng, resamples=20_000)[
        statistic
    ]
    f = oracles.AXIS_STATISTICS[statistic]
    ref = stats.bootstrap(
        (base, spec),
        lambda x, y, axis: f(x, axis=axis) / f(y, axis=axis),
        method="percentile",
        n_resamples=20_000,
        paired=True,
        vectorized=True,
        rng=np.random.default_rng(2),
    ).confidence_interval
    assert math.isnan(ours.estimate)  # bounds only: the estimate is the caller's, from samples
    # two independent Monte-Carlo runs of the same bootstrap distribution
    assert ours.lower == pytest.approx(ref.low, rel=0.01)
    assert ours.upper == pytest.approx(ref.high, rel=0.01)


def test_paired_replicates_are_numpys_statistics_of_each_resample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Replicate r of both arms is the statistic of the same resampled pairs, in chunks."""
    monkeypatch.setattr(bootstrap, "_CHUNK_ELEMENTS", 1000)  # 7 resamples per chunk
    rng = np.random.default_rng(3)
    base, spec = rng.lognormal(0.0, 0.5, 137), rng.lognormal(0.0, 0.5, 137)
    reps = paired_replicates(base, spec, STATISTICS, np.random.default_rng(4), 40)
    draws = np.random.default_rng(4)
    idx = np.concatenate([draws.integers(0, 137, size=(k, 137)) for k in [7] * 5 + [5]])
    for stat in STATISTICS:
        for arm, values in enumerate((base, spec)):
            if stat == "mean":
                want = values[idx].mean(axis=1)
            else:
                want = np.quantile(values[idx], QUANTILE_LEVELS[stat], axis=1)
            np.testing.assert_allclose(reps[stat][arm], want, rtol=1e-12)


def test_identical_pairs_give_a_degenerate_interval() -> None:
    x = np.random.default_rng(5).lognormal(size=300)
    out = paired_speedup_intervals(x, x.copy(), statistics=STATISTICS, rng=np.random.default_rng(6))
    for stat in STATISTICS:
        assert out[stat].lower == out[stat].upper == pytest.approx(1.0, rel=1e-12)


def test_same_seed_same_interval() -> None:
    x = np.random.default_rng(0).lognormal(size=500)
    y = np.random.default_rng(1).lognormal(size=500)
    a = paired_speedup_intervals(x, y, statistics=["p99"], rng=np.random.default_rng(7))
    b = paired_speedup_intervals(x, y, statistics=["p99"], rng=np.random.default_rng(7))
    assert a["p99"].lower == b["p99"].lower and a["p99"].upper == b["p99"].upper


def test_percentile_bounds_ignore_nan_replicates() -> None:
    reps = np.concatenate([np.linspace(1.0, 2.0, 1001), [np.nan, np.inf]])
    assert percentile_interval(reps, 0.9) == pytest.approx((1.05, 1.95))
    assert all(math.isnan(b) for b in percentile_interval(np.array([np.nan]), 0.95))
    assert Interval(1.0, math.nan, math.inf).to_dict() == {
        "estimate": 1.0,
        "lower": None,
        "upper": None,
    }


def test_empty_pairs_give_nan_and_unequal_lengths_are_refused() -> None:
    out = paired_speedup_intervals(
        np.array([]), np.array([]), statistics=["median"], rng=np.random.default_rng(0)
    )
    assert math.isnan(out["median"].lower) and math.isnan(out["median"].upper)
    with pytest.raises(ValueError, match="same length"):
        paired_speedup_intervals(
            np.ones(3), np.ones(4), statistics=["median"], rng=np.random.default_rng(0)
        )
