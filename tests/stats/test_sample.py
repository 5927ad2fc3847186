"""`ArmSample`, the one form: rows become it as the writer's summaries do, its point statistics
lie within the grid bound of numpy's on the values, and its block replicates are the exact
weighted bootstrap of the values within that bound."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.records import Arm, RequestRecord
from specproxy.stats.estimate.blockboot import block_speedup_intervals
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS, STATISTICS
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import GRID_ERROR_BOUND
from specproxy.summary.minute import minute_of, rollup_records

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
T0 = 1_700_000_040.0  # a minute boundary
MINUTES = 60
BOUND = math.log1p(GRID_ERROR_BOUND) + 1e-12


def _records(seed: int = 1, per_minute: int = 40) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out: list[RequestRecord] = []
    for arm, scale in (("baseline", 1.0), ("speculative", 1.3)):
        n = MINUTES * per_minute
        t = np.sort(rng.uniform(T0, T0 + MINUTES * 60, n))
        e2e = rng.lognormal(0.0, 0.5, n) / scale
        out.extend(
            RequestRecord(
                request_id=f"{arm}-{i}",
                run_id="run",
                arm=arm,
                t_start=float(t[i]),
                model="m",
                endpoint="completions",
                stream=True,
                status=200,
                e2e_s=float(e2e[i]),
                upstream_s=float(e2e[i]),
            )
            for i in range(n)
        )
    return out


def _values(records: list[RequestRecord], arm: Arm) -> tuple[FloatArray, IntArray]:
    mine = [r for r in records if r.arm == arm]
    values = np.array([r.e2e_s for r in mine])
    units = np.array([minute_of(r.t_start) - minute_of(T0) for r in mine], dtype=np.int64)
    return values, units


def test_rows_become_the_writers_summaries() -> None:
    records = _records(seed=2)
    batch = rollup_records(records)
    for arm in ("speculative", "baseline"):
        values, units = _values(records, arm)
        sample = ArmSample.from_values(values, units, MINUTES)
        # bin rows: (run_id, metric, minute, model, arm, bin, count)
        written = sorted(
            (b[2] - minute_of(T0), b[5], b[6]) for b in batch.bins if b[4] == arm and b[1] == "e2e"
        )
        got = sorted(
            zip(sample.unit.tolist(), sample.bins.tolist(), sample.counts.tolist(), strict=True)
        )
        assert got == written
        # summary rows: (run_id, metric, minute, model, arm, n, sum, sum_sq)
        sums = {
            s[2] - minute_of(T0): (s[5], s[6])
            for s in batch.summaries
            if s[4] == arm and s[1] == "e2e"
        }
        for unit, (n, total) in sums.items():
            assert sample.unit_n[unit] == n and sample.unit_sum[unit] == pytest.approx(total)


def test_point_statistics_lie_within_the_grid_bound_of_the_values() -> None:
    rng = np.random.default_rng(3)
    for n in (1, 2, 7, 100, 5001):
        values = rng.lognormal(0.0, 0.7, n)
        sample = ArmSample.from_values(values, np.zeros(n, dtype=np.int64), 1)
        for stat, p in QUANTILE_LEVELS.items():
            got, want = sample.statistic(stat), float(np.quantile(values, p))
            assert abs(math.log(got / want)) <= BOUND / 2 + 1e-12, (n, stat)
        assert sample.mean() == pytest.approx(float(values.mean()), rel=1e-12)
    empty = ArmSample.empty(3)
    assert empty.n == 0 and math.isnan(empty.statistic("median")) and math.isnan(empty.mean())


def _exact_ci(
    values: tuple[FloatArray, FloatArray],
    units: tuple[IntArray, IntArray],
    weights: FloatArray,
    block_units: int,
    stat: str,
) -> tuple[float, float]:
    """The block bootstrap on the values themselves: each value weighs its block's weight."""
    reps = []
    for v, u in zip(values, units, strict=True):
        order = np.argsort(v)
        w = weights[:, u[order] // block_units]
        if stat == "mean":
            reps.append((w @ v[order]) / w.sum(axis=1))
            continue
        rank = np.floor((w.sum(axis=1) - 1) * QUANTILE_LEVELS[stat])
        idx = (np.cumsum(w, axis=1) <= rank[:, None]).sum(axis=1)
        reps.append(v[order][idx])
    lo, hi = np.quantile(reps[0] / reps[1], [0.025, 0.975])
    return float(lo), float(hi)


def test_block_intervals_are_the_exact_weighted_bootstrap_within_the_grid_bound() -> None:
    records = _records()
    raw = {arm: _values(records, arm) for arm in ("speculative", "baseline")}
    arms = {arm: ArmSample.from_values(*raw[arm], MINUTES) for arm in ("speculative", "baseline")}
    block_units, resamples, seed = 3, 400, 11
    result = block_speedup_intervals(
        arms["baseline"],
        arms["speculative"],
        statistics=STATISTICS,
        rng=np.random.default_rng(seed),
        resamples=resamples,
        block_units=block_units,
        expand=False,  # the replicates' own percentile interval
    )
    draws = np.random.default_rng(seed).poisson(1.0, size=(resamples, MINUTES // block_units))
    values = (raw["baseline"][0], raw["speculative"][0])
    units = (raw["baseline"][1], raw["speculative"][1])
    for stat in STATISTICS:
        lo, hi = _exact_ci(values, units, draws.astype(np.float64), block_units, stat)
        block = result.intervals[stat].block
        tol = 1e-12 if stat == "mean" else BOUND
        assert abs(math.log(block.lower / lo)) <= tol, stat
        assert abs(math.log(block.upper / hi)) <= tol, stat
