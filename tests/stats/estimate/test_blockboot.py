"""Time-block bootstrap on `ArmSample`s: exactness of its replicates, joint weighting, the
i.i.d. interval from histograms against the exact bootstrap of the values (the oracle, within the
grid bound when driven by the same draws), and coverage simulations.

The simulations (`-m slow`, figures printed with `-s`) use RUNS = 600 replications per setting
and 499 resamples, n = 10k per arm over 200 minutes, both intervals from the arms' minute samples
alone. Soundness of the assertions: at a true
coverage of 0.95 the Monte-Carlo SE of a coverage estimate is sqrt(0.95 * 0.05 / 600) = 0.0089,
so the band [0.93, 0.97] is +-2.25 SE (a method with true coverage 0.95 passes each check with
probability 0.976). The i.i.d. bootstrap's under-coverage is asserted (<= 0.91) only where it is
expected well below: AR(1) median 0.885 and mean 0.86 in theory (variance inflation 1.55 and
1.77), load waves 0.80-0.87; at p = 0.87 the SE is 0.0137, so the margin is 1.8-3.7 SE for AR(1)
and more for waves. Seeds are fixed, so the figures are reproducible exactly; with seed 20261201:

    setting  statistic  block  i.i.d.
    iid      median     0.948  0.957     (block length rule: 2 x Politis-White, >= 20 blocks)
    iid      mean       0.945  0.943
    iid      p90        0.952  0.963
    iid      p99        0.955  0.958
    ar1      median     0.932  0.855
    ar1      mean       0.932  0.857
    ar1      p90        0.957  0.922
    ar1      p99        0.953  0.945
    waves    median     0.948  0.868
    waves    mean       0.943  0.793
    waves    p90        0.938  0.830
    waves    p99        0.942  0.920

P99 hardly under-covers under AR(1): tail indicators of a Gaussian AR(1) are nearly independent.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
import scipy.signal
from scipy import stats

from specproxy.stats.estimate import blockboot
from specproxy.stats.estimate.blockboot import (
    MAX_BLOCKS,
    _BlockQuantiles,
    _iid_replicates,
    _order_stat_bins,
    _regroup,
    block_speedup_intervals,
    unit_correlation,
    value_speedup_intervals,
)
from specproxy.stats.estimate.blocklength import plan_blocks
from specproxy.stats.estimate.bootstrap import Interval, percentile_interval
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS, STATISTICS
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import GRID_ERROR_BOUND, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_centres, bin_index
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]
D = GRID_LOG_WIDTH
QUANTILES = ["median", "p90", "p99"]


def _arm(
    rng: np.random.Generator, units: int, per_unit: int, scale: float
) -> tuple[ArmSample, FloatArray]:
    t = np.sort(rng.uniform(0, units, units * per_unit))
    v = rng.lognormal(0.0, 0.5, t.size) / scale
    return ArmSample.from_values(v, np.floor(t).astype(np.int64), units), v


def _one_unit(values: FloatArray) -> ArmSample:
    return ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)


@pytest.mark.parametrize("dense_cells", [blockboot._DENSE_CELLS, 0])
def test_block_quantile_replicates_are_the_weighted_order_statistics_within_half_a_bin(
    dense_cells: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(blockboot, "_DENSE_CELLS", dense_cells)  # dense matrix, masks per group
    rng = np.random.default_rng(3)
    units, per = 30, 40
    unit = np.repeat(np.arange(units), per)
    values = rng.lognormal(0.0, 0.7, unit.size)
    arm = ArmSample.from_values(values, unit, units)
    data = _regroup(arm, block_units=3, blocks=10)
    weights = rng.poisson(1.0, size=(50, 10)).astype(np.float64)
    quantiles = _BlockQuantiles(data, weights)
    for p in (0.5, 0.9, 0.99):
        reps = quantiles.quantile(p)
        order = np.argsort(values)
        for r in range(weights.shape[0]):
            w = weights[r, unit[order] // 3]
            total = w.sum()
            rank = math.floor((total - 1) * p)
            exact = values[order][np.searchsorted(np.cumsum(w), rank, side="right")]
            assert abs(math.log(reps[r] / exact)) <= D / 2 + 1e-12


def test_block_mean_replicates_are_exact_weighted_means() -> None:
    rng = np.random.default_rng(4)
    unit = np.repeat(np.arange(20), 25)
    b_values = rng.lognormal(0.0, 0.5, unit.size)
    s_values = rng.lognormal(0.0, 0.5, unit.size)
    b = ArmSample.from_values(b_values, unit, 20)
    s = ArmSample.from_values(s_values, unit, 20)
    res = block_speedup_intervals(
        b,
        s,
        statistics=["mean"],
        rng=np.random.default_rng(9),
        resamples=200,
        block_units=1,
        expand=False,  # the replicates' own percentile interval
    )
    w = np.random.default_rng(9).poisson(1.0, size=(200, 20)).astype(np.float64)
    wb, ws = w[:, unit], w[:, unit]
    ratios = ((wb @ b_values) / wb.sum(axis=1)) / ((ws @ s_values) / ws.sum(axis=1))
    lo, hi = np.quantile(ratios, [0.025, 0.975])
    block = res.intervals["mean"].block
    assert block.lower == pytest.approx(lo, rel=1e-12)
    assert block.upper == pytest.approx(hi, rel=1e-12)
    assert block.estimate == pytest.approx(b_values.mean() / s_values.mean(), rel=1e-12)


def test_the_expansion_widens_the_percentile_interval_about_the_replicates_median() -> None:
    rng = np.random.default_rng(10)
    b, _ = _arm(rng, 40, 30, 1.0)
    s, _ = _arm(rng, 40, 30, 1.25)
    plain, wide = (
        block_speedup_intervals(
            b,
            s,
            statistics=STATISTICS,
            rng=np.random.default_rng(1),
            resamples=400,
            block_units=2,
            expand=expand,
        )
        for expand in (False, True)
    )
    k = wide.plan.blocks
    for stat in STATISTICS:
        p, w = plain.intervals[stat], wide.intervals[stat]
        assert p.expansion == 1.0 and math.isnan(p.df)
        assert 2.0 <= w.df <= k - 1, stat
        # at least sqrt(k/(k-1)) t_{k-1} / z, the factor for k equal Gaussian blocks
        t_k = stats.t.ppf(0.975, k - 1) / stats.norm.ppf(0.975)
        assert w.expansion >= math.sqrt(k / (k - 1)) * t_k - 1e-12, stat
        # the same replicates, log distances from a common centre scaled by the factor
        lo, hi = math.log(p.block.lower), math.log(p.block.upper)
        wlo, whi = math.log(w.block.lower), math.log(w.block.upper)
        centre = (whi - w.expansion * hi) / (1 - w.expansion)
        assert wlo == pytest.approx(centre + w.expansion * (lo - centre), abs=1e-9), stat
        assert lo <= centre <= hi


def test_unit_influence_is_the_count_above_the_pooled_quantile_or_the_centred_sum() -> None:
    rng = np.random.default_rng(11)
    unit = np.repeat(np.arange(25), 40)
    values = rng.lognormal(0.0, 0.5, unit.size)
    arm = ArmSample.from_values(values, unit, 25)
    mean = arm.unit_influence("mean")
    expected = np.bincount(unit, weights=values - values.mean())
    assert mean == pytest.approx(expected, rel=1e-9, abs=1e-9)
    for stat in ("median", "p90", "p99"):
        q = arm.order_statistic(math.floor((arm.n - 1) * QUANTILE_LEVELS[stat]) + 1)
        above = np.bincount(unit, weights=(values > q * (1 + GRID_ERROR_BOUND)).astype(float))
        infl = arm.unit_influence(stat)
        assert float(infl.sum()) == pytest.approx(0.0, abs=1e-9)
        share = above.sum() / values.size
        assert infl == pytest.approx(above - share * 40, abs=1e-9), stat


def test_a_tail_dependent_on_slow_periods_gets_longer_blocks_than_the_mean_log_asks() -> None:
    """Slow periods of 6 units that stall 4 % of requests (x e^2, the top percent): barely
    visible in the mean log series of 10 requests a unit, plain in the P99 exceedances (seeds
    0-19: blocks 2-15x as long as the mean log series alone asks for)."""
    rng = np.random.default_rng(12)
    units, per = 1000, 10
    unit = np.repeat(np.arange(units), per)
    arms = []
    for _ in range(2):
        starts = np.flatnonzero(rng.uniform(size=units) < 1 / 20)
        slow = np.zeros(units, dtype=bool)
        for start in starts:
            slow[start : start + 6] = True
        log = rng.normal(0.0, 0.5, unit.size)
        log += 2.0 * (slow[unit] & (rng.uniform(size=unit.size) < 0.04))
        arms.append(ArmSample.from_values(np.exp(log), unit, units))
    body = plan_blocks([a.unit_log_means() for a in arms], units)
    res = block_speedup_intervals(
        arms[0], arms[1], statistics=["median", "p99"], rng=rng, resamples=100
    )
    assert res.plan.politis_white > 1.5 * body.politis_white
    assert res.plan.block_units >= 2 * body.block_units


def test_identical_mirrored_arms_give_a_degenerate_interval_because_weights_are_joint() -> None:
    rng = np.random.default_rng(5)
    unit = np.repeat(np.arange(40), 30)
    values = rng.lognormal(0.0, 0.5, unit.size)
    arm = ArmSample.from_values(values, unit, 40)
    res = block_speedup_intervals(arm, arm, statistics=STATISTICS, rng=rng, resamples=300)
    for stat in STATISTICS:
        block = res.intervals[stat].block
        assert block.lower == pytest.approx(1.0, rel=1e-12), stat
        assert block.upper == pytest.approx(1.0, rel=1e-12), stat
        assert res.intervals[stat].reported == "block"


def test_point_estimates_agree_with_raw_values_within_the_grid_bound() -> None:
    rng = np.random.default_rng(6)
    b, bv = _arm(rng, 50, 100, 1.0)
    s, sv = _arm(rng, 50, 100, 1.3)
    res = block_speedup_intervals(b, s, statistics=STATISTICS, rng=rng, resamples=50)
    for name in QUANTILES:
        exact = oracles.point_statistic(bv, name) / oracles.point_statistic(sv, name)
        assert abs(b.statistic(name) / s.statistic(name) / exact - 1) <= GRID_ERROR_BOUND
        assert abs(res.intervals[name].interval.estimate / exact - 1) <= GRID_ERROR_BOUND
    assert b.statistic("mean") == pytest.approx(bv.mean(), rel=1e-12)
    assert res.intervals["mean"].interval.estimate == pytest.approx(
        bv.mean() / sv.mean(), rel=1e-12
    )


def test_too_few_blocks_reports_the_iid_interval_and_says_why() -> None:
    rng = np.random.default_rng(7)
    b, _ = _arm(rng, 10, 50, 1.0)
    s, _ = _arm(rng, 10, 50, 1.2)
    res = block_speedup_intervals(b, s, statistics=["median"], rng=rng, resamples=200)
    interval = res.intervals["median"]
    assert not res.plan.reliable
    assert interval.reported == "iid" and interval.interval == interval.iid
    assert interval.reason is not None and "too few" in interval.reason
    assert interval.to_dict()["method"] == "iid"


def test_an_arm_without_data_gives_no_interval() -> None:
    rng = np.random.default_rng(8)
    b, _ = _arm(rng, 30, 10, 1.0)
    res = block_speedup_intervals(b, ArmSample.empty(30), statistics=["p99"], rng=rng, resamples=50)
    assert math.isnan(res.intervals["p99"].interval.estimate)
    assert res.intervals["p99"].reason == "an arm has no data"
    with pytest.raises(ValueError, match="same time units"):
        block_speedup_intervals(b, ArmSample.empty(29), statistics=["p99"], rng=rng)


def test_units_outside_the_window_are_rejected() -> None:
    with pytest.raises(ValueError, match="unit ids"):
        ArmSample.from_values(np.array([1.0, 2.0]), np.array([0, 5]), 5)


def test_blocks_are_capped_and_hold_whole_pieces() -> None:
    rng = np.random.default_rng(10)
    units = 2500
    unit = rng.integers(0, units, 4000)
    arm = ArmSample.from_values(rng.lognormal(0.0, 0.5, unit.size), unit, units)
    capped = block_speedup_intervals(arm, arm, statistics=["mean"], rng=rng, block_units=1)
    assert capped.plan.block_units == math.ceil(units / MAX_BLOCKS) == 3
    assert capped.plan.blocks == math.ceil(units / 3) <= MAX_BLOCKS and capped.plan.reliable
    hours = dataclasses.replace(arm, piece_units=60)  # entries standing for hour blocks
    pieces = block_speedup_intervals(hours, hours, statistics=["mean"], rng=rng, block_units=1)
    assert pieces.plan.block_units == 60 and pieces.plan.blocks == math.ceil(units / 60)


def test_the_unit_correlation_is_measured_over_units_both_arms_hold() -> None:
    rng = np.random.default_rng(11)
    units = 60
    load = rng.normal(0.0, 0.5, units)
    unit = np.repeat(np.arange(units), 20)
    arms = [
        ArmSample.from_values(np.exp(load[unit] + rng.normal(0.0, 0.3, unit.size)), unit, units)
        for _ in range(2)
    ]
    got = unit_correlation(*arms)
    a, b = arms[0].unit_log_means(), arms[1].unit_log_means()
    assert got == pytest.approx(float(np.corrcoef(a, b)[0, 1]), rel=1e-9)
    assert got is not None and got > 0.8
    few = np.repeat(np.arange(10), 20)  # fewer units with data than MIN_BLOCKS
    sparse = ArmSample.from_values(rng.lognormal(size=few.size), few, units)
    assert unit_correlation(sparse, arms[0]) is None


def test_iid_order_statistics_from_a_histogram_match_the_raw_ones_within_half_a_bin() -> None:
    values = np.random.default_rng(9).lognormal(0.0, 0.5, 5001)  # (n-1)p whole: no interpolation
    bins, counts = _one_unit(values).pooled()
    for name, p in (("median", 0.5), ("p90", 0.9), ("p99", 0.99)):
        binned = _order_stat_bins(bin_centres(bins), counts, p, np.random.default_rng(1), 500)
        exact = oracles.split_replicates(values, [name], np.random.default_rng(1), 500)[name]
        assert float(np.max(np.abs(np.log(binned / exact)))) <= D / 2 + 1e-12


def test_iid_quantile_intervals_are_the_exact_ones_within_the_grid_bound() -> None:
    """Driven by the same draws (the block weights first, then each arm's order statistics),
    the i.i.d. interval from histograms and the exact bootstrap of the values (oracle) differ
    by at most a bin per replicate ratio: estimates and bounds within GRID_ERROR_BOUND."""
    rng = np.random.default_rng(12)
    base, spec = rng.lognormal(0.0, 0.5, 10_001), rng.lognormal(-0.2, 0.6, 8001)  # (n-1)p whole
    for seed in range(3):
        got = value_speedup_intervals(
            base, spec, statistics=QUANTILES, rng=np.random.default_rng(seed), resamples=999
        )
        same = np.random.default_rng(seed)
        same.poisson(1.0, size=(999, 1))  # the (one) block's weights, drawn first
        want = oracles.split_speedup_intervals(
            base, spec, statistics=QUANTILES, rng=same, resamples=999
        )
        for stat in QUANTILES:
            for g, w in zip(
                (got[stat].estimate, got[stat].lower, got[stat].upper),
                (want[stat].estimate, want[stat].lower, want[stat].upper),
                strict=True,
            ):
                assert abs(g / w - 1) <= GRID_ERROR_BOUND, (seed, stat)


def _split_by_bin(
    weights: npt.NDArray[np.int64], bin_of: npt.NDArray[np.int64], rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """Per-value weights (R x n) whose per-bin sums are `weights` (R x bins), each bin's weight
    spread uniformly over its values: given their sums, i.i.d. Poisson(1) weights per value are
    exactly that multinomial, so this couples a per-value Poisson bootstrap with the binned one."""
    order = np.argsort(bin_of, kind="stable")
    size = np.bincount(bin_of, minlength=weights.shape[1])
    start = np.concatenate([[0], np.cumsum(size)[:-1]])
    out = np.zeros((weights.shape[0], bin_of.size), dtype=np.int64)
    for r in range(weights.shape[0]):
        draws = np.repeat(np.arange(weights.shape[1]), weights[r])
        member = start[draws] + np.floor(rng.random(draws.size) * size[draws]).astype(np.int64)
        out[r] = np.bincount(order[member], minlength=bin_of.size)
    return out


def test_iid_mean_replicates_are_the_exact_poisson_ones_within_a_coarse_bin() -> None:
    """The i.i.d. mean is a Poisson bootstrap over 1 % bins (50 grid bins). Coupled with a
    per-value Poisson bootstrap that has the same weight in every bin, each replicate is within
    exp(+-50 d) of the exact one (a bin's mean of centres and each of its values lie in the same
    coarse bin), so a ratio's CI bound is within exp(+-100 d) (~2 %)."""
    coarsen = blockboot._MEAN_COARSEN
    rng = np.random.default_rng(13)
    reps: list[tuple[FloatArray, FloatArray]] = []
    for values in (rng.lognormal(0.0, 0.5, 3000), rng.lognormal(-0.1, 0.8, 2000)):
        arm = _one_unit(values)
        got = _iid_replicates(arm, ["mean"], np.random.default_rng(14), 300)["mean"]
        # the same draws, recomputed: the per-bin Poisson weights of the production code
        bins, counts = arm.pooled()
        coarse, j = np.unique(np.floor_divide(bins, coarsen), return_inverse=True)
        cc = np.bincount(j, weights=counts)
        weights = np.random.default_rng(14).poisson(cc, size=(300, coarse.size))
        means = np.bincount(j, weights=counts * bin_centres(bins)) / cc
        np.testing.assert_allclose(got, (weights @ means) / weights.sum(axis=1), rtol=1e-12)
        bin_of = np.searchsorted(coarse, np.floor_divide(bin_index(values), coarsen))
        per_value = _split_by_bin(weights, bin_of, rng)
        exact = (per_value @ values) / per_value.sum(axis=1)
        assert float(np.max(np.abs(np.log(got / exact)))) <= coarsen * D + 1e-12
        reps.append((got, exact))
    binned_ci = percentile_interval(reps[0][0] / reps[1][0], 0.95)
    exact_ci = percentile_interval(reps[0][1] / reps[1][1], 0.95)
    for g, w in zip(binned_ci, exact_ci, strict=True):
        assert abs(math.log(g / w)) <= 2 * coarsen * D + 1e-12


def test_the_mean_of_large_arms_takes_the_poisson_bootstraps_normal_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """From `_NORMAL_MEAN_N` requests the i.i.d. mean is drawn from the Poisson bootstrap's
    normal limit: the same interval up to Monte-Carlo error, and the exact mean as estimate."""
    rng = np.random.default_rng(15)
    base, spec = rng.lognormal(0.0, 0.5, 12_000), rng.lognormal(-0.1, 0.5, 12_000)
    poisson = value_speedup_intervals(
        base, spec, statistics=["mean"], rng=np.random.default_rng(1), resamples=2000
    )["mean"]
    monkeypatch.setattr(blockboot, "_NORMAL_MEAN_N", 10_000)
    normal = value_speedup_intervals(
        base, spec, statistics=["mean"], rng=np.random.default_rng(2), resamples=2000
    )["mean"]
    exact = oracles.split_speedup_intervals(
        base, spec, statistics=["mean"], rng=np.random.default_rng(3), resamples=2000
    )["mean"]
    width = exact.upper - exact.lower
    for got in (poisson, normal):
        assert got.estimate == pytest.approx(base.mean() / spec.mean(), rel=1e-12)
        assert abs(got.lower - exact.lower) < 0.1 * width
        assert abs(got.upper - exact.upper) < 0.1 * width


@pytest.mark.parametrize("statistic", ["median", "mean", "p90"])
def test_value_intervals_agree_with_scipys_percentile_bootstrap(statistic: str) -> None:
    rng = np.random.default_rng(1)
    base = rng.lognormal(0.0, 0.5, 151)  # (n - 1)p whole: the order statistic numpy takes
    spec = rng.lognormal(-0.1, 0.5, 151)
    ours = value_speedup_intervals(base, spec, statistics=[statistic], rng=rng, resamples=20_000)[
        statistic
    ]
    f = oracles.AXIS_STATISTICS[statistic]
    ref = stats.bootstrap(
        (base, spec),
        lambda x, y, axis: f(x, axis=axis) / f(y, axis=axis),
        method="percentile",
        n_resamples=20_000,
        vectorized=True,
        rng=np.random.default_rng(2),
    ).confidence_interval
    exact = float(f(base, None) / f(spec, None))
    assert abs(ours.estimate / exact - 1) <= GRID_ERROR_BOUND
    # two independent Monte-Carlo runs of the same bootstrap distribution
    assert ours.lower == pytest.approx(ref.low, rel=0.01)
    assert ours.upper == pytest.approx(ref.high, rel=0.01)


def test_value_intervals_drop_unusable_values_and_repeat_with_the_seed() -> None:
    rng = np.random.default_rng(16)
    x, y = rng.lognormal(size=500), rng.lognormal(size=500)
    a = value_speedup_intervals(x, y, statistics=["p99"], rng=np.random.default_rng(7))
    b = value_speedup_intervals(x, y, statistics=["p99"], rng=np.random.default_rng(7))
    assert a == b
    dirty = np.concatenate([x, [0.0, -1.0, np.nan, np.inf]])
    assert value_speedup_intervals(dirty, y, statistics=["p99"], rng=np.random.default_rng(7)) == a
    with pytest.raises(ValueError, match="strictly positive"):
        ArmSample.from_values(dirty, np.zeros(dirty.size, dtype=np.int64), 1)
    empty = value_speedup_intervals(
        np.array([]), np.ones(5), statistics=["median"], rng=np.random.default_rng(0)
    )
    assert math.isnan(empty["median"].estimate) and math.isnan(empty["median"].lower)


def test_iid_intervals_given_by_the_caller_are_used_as_given() -> None:
    """The paired design passes its bootstrap over pairs as the i.i.d. interval."""
    rng = np.random.default_rng(17)
    b, _ = _arm(rng, 40, 30, 1.0)
    s, _ = _arm(rng, 40, 30, 1.2)
    given = {"median": Interval(math.nan, 1.1, 1.3)}
    res = block_speedup_intervals(b, s, statistics=["median"], rng=rng, iid=given)
    iid = res.intervals["median"].iid
    assert (iid.lower, iid.upper) == (1.1, 1.3)
    assert iid.estimate == b.statistic("median") / s.statistic("median")


# ---------------------------------------------------------------- coverage simulations (slow)

RUNS = 600
RESAMPLES = 499
UNITS = 200  # minutes
PER_UNIT = 50  # requests per minute per arm -> n = 10k per arm (P99 needs >= 10k)
SIGMA = 0.5
SPEEDUP = 1.25
WAVE_PERIOD = 3.0  # minutes per load wave
WAVE_MAX_HEIGHT = 1.0  # wave heights on log latency are uniform on [0, WAVE_MAX_HEIGHT]
# How much each arm's log latency follows the shared load. A wave that scaled both arms by the same
# factor would cancel in the ratio (both arms sample the same minutes), so the i.i.d. bootstrap
# would over-cover, not under-cover; speculation suffering more under load (vLLM RFC #4565) makes
# the run's ratio depend on the load it happened to see, which only time blocks capture.
ELASTICITY = {"baseline": 1.0, "speculative": 1.5}

Setting = Callable[[np.random.Generator, str, FloatArray], FloatArray]


def _iid(rng: np.random.Generator, _arm_name: str, t: FloatArray) -> FloatArray:
    return rng.normal(0.0, SIGMA, t.size)


def _ar1(rng: np.random.Generator, _arm_name: str, t: FloatArray) -> FloatArray:
    """AR(1) with rho = 0.3 over the arm's requests in time order, marginal sd SIGMA."""
    rho = 0.3
    eps = rng.normal(0.0, SIGMA * math.sqrt(1 - rho**2), t.size)
    eps[0] = rng.normal(0.0, SIGMA)
    return np.asarray(scipy.signal.lfilter([1.0], [1.0, -rho], eps), dtype=np.float64)


def _wave(t: FloatArray, heights: FloatArray, offset: float) -> FloatArray:
    """Raised-cosine load waves of period WAVE_PERIOD, each with its own height."""
    phase = (t + offset) / WAVE_PERIOD
    cycle = np.floor(phase).astype(np.int64)
    out: FloatArray = heights[cycle] * (1 - np.cos(2 * np.pi * (phase - cycle))) / 2
    return out


def _draw_run(rng: np.random.Generator, setting: str) -> tuple[ArmSample, ArmSample]:
    """Both arms of one run as the job holds them: per-minute histograms of their values."""
    n = UNITS * PER_UNIT
    heights = rng.uniform(0.0, WAVE_MAX_HEIGHT, int(UNITS / WAVE_PERIOD) + 2)
    offset = rng.uniform(0, WAVE_PERIOD)
    arms: list[ArmSample] = []
    for name, shift in (("baseline", 0.0), ("speculative", -math.log(SPEEDUP))):
        t = np.sort(rng.uniform(0, UNITS, n))
        if setting == "iid":
            log = _iid(rng, name, t)
        elif setting == "ar1":
            log = _ar1(rng, name, t)
        else:
            log = rng.normal(0.0, SIGMA, n) + ELASTICITY[name] * _wave(t, heights, offset)
        values = np.exp(shift + log)
        arms.append(ArmSample.from_values(values, np.floor(t).astype(np.int64), UNITS))
    return arms[0], arms[1]


@functools.cache
def _truth(setting: str) -> dict[str, float]:
    """True speedups: 1.25 unless the arms follow load differently (waves), then by Monte Carlo
    on the stationary law with 8M draws per arm (relative SE <= 0.1 % for P99, against CI
    half-widths of about 3 %)."""
    if setting != "waves":
        return dict.fromkeys(STATISTICS, SPEEDUP)
    rng = np.random.default_rng(12345)
    m = 8_000_000
    load = rng.uniform(0.0, WAVE_MAX_HEIGHT, m) * (1 - np.cos(2 * np.pi * rng.uniform(size=m)))
    load /= 2
    base = np.exp(rng.normal(0.0, SIGMA, m) + ELASTICITY["baseline"] * load)
    spec = np.exp(-math.log(SPEEDUP) + rng.normal(0.0, SIGMA, m) + ELASTICITY["speculative"] * load)
    out = {"mean": float(base.mean() / spec.mean())}
    for stat, p in (("median", 0.5), ("p90", 0.9), ("p99", 0.99)):
        out[stat] = float(np.quantile(base, p) / np.quantile(spec, p))
    return out


def _coverage(setting: str, seed: int) -> tuple[dict[str, float], dict[str, float]]:
    rng = np.random.default_rng(seed)
    truth = _truth(setting)
    block_hits: dict[str, int] = dict.fromkeys(STATISTICS, 0)
    iid_hits: dict[str, int] = dict.fromkeys(STATISTICS, 0)
    for _ in range(RUNS):
        b, s = _draw_run(rng, setting)
        res = block_speedup_intervals(b, s, statistics=STATISTICS, rng=rng, resamples=RESAMPLES)
        for stat, interval in res.intervals.items():
            block_hits[stat] += interval.block.lower <= truth[stat] <= interval.block.upper
            iid_hits[stat] += interval.iid.lower <= truth[stat] <= interval.iid.upper
    return (
        {k: v / RUNS for k, v in block_hits.items()},
        {k: v / RUNS for k, v in iid_hits.items()},
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("setting", "iid_undercovers"),
    [("iid", ()), ("ar1", ("median", "mean")), ("waves", ("median", "mean", "p90"))],
    # each setting takes about 2 CPU-minutes
)
def test_block_bootstrap_coverage(setting: str, iid_undercovers: tuple[str, ...]) -> None:
    block, iid = _coverage(setting, seed=20261201)
    se = math.sqrt(0.95 * 0.05 / RUNS)
    for stat in STATISTICS:
        print(
            f"\n{setting} {stat}: block {block[stat]:.3f}  iid {iid[stat]:.3f} "
            f"(runs={RUNS}, MC se {se:.4f}, n={UNITS * PER_UNIT}/arm)"
        )
    for stat in STATISTICS:
        assert 0.93 <= block[stat] <= 0.97, (stat, block[stat])
    for name in iid_undercovers:
        assert iid[name] <= 0.91, (name, iid[name])
