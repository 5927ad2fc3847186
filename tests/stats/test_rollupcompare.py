"""Rows and rollups agree on the same data within the documented binning bound.

The rollup path bins every value on the fixed grid; the exact path keeps the values. With the
same bootstrap weights every quantile replicate of the rollup path is within exp(+-d/2) of the
exact weighted order statistic, so ratio CI bounds agree within `GRID_ERROR_BOUND` (0.02 %),
means agree exactly (sums are stored), and the anytime-valid bounds (order statistics) within the
same bound.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.records import Arm, RequestRecord
from specproxy.stats.anytime.sequential import (
    RankedArm,
    compare_sequential,
    compare_sequential_ranked,
)
from specproxy.stats.anytime.verdict import anytime_valid, anytime_valid_binned
from specproxy.stats.compare import CompareSettings, compare_window
from specproxy.stats.estimate.blockboot import ArmBlocks, block_speedup_intervals
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS, STATISTICS
from specproxy.stats.result import METRICS
from specproxy.stats.rollupcompare import UNAVAILABLE_FROM_ROLLUPS, _arms, compare_rollup_window
from specproxy.summary.grid import COARSE_FACTOR, GRID_ERROR_BOUND, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_centres, bin_index, coarse_as_fine, coarse_bin
from specproxy.summary.minute import MOMENT_SUMS, minute_of, rollup_records
from tests.store.helpers import RollupRows, rollup_rows_from

FloatArray = npt.NDArray[np.float64]
T0 = 1_700_000_040.0  # a minute boundary
MINUTES = 60
BOUND = math.log1p(GRID_ERROR_BOUND) + 1e-12


def _records(seed: int = 1, per_minute: int = 40) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for arm, scale in ((Arm.BASELINE, 1.0), (Arm.SPECULATIVE, 1.3)):
        n = MINUTES * per_minute
        t = np.sort(rng.uniform(T0, T0 + MINUTES * 60, n))
        e2e = rng.lognormal(0.0, 0.5, n) / scale
        for i in range(n):
            out.append(
                RequestRecord(
                    request_id=f"{arm.value}-{i}",
                    run_id="run",
                    arm=arm,
                    t_start=float(t[i]),
                    model="m",
                    endpoint="completions",
                    stream=True,
                    status=200,
                    e2e_s=float(e2e[i]),
                    upstream_s=float(e2e[i]),
                    ttft_s=float(e2e[i]) / 5,
                    tpot_s=float(e2e[i]) / 50,
                    prompt_tokens=10 + i % 7,
                    output_tokens=40 + i % 13,
                )
            )
    return out


def _rows(records: list[RequestRecord], arm: Arm, metric: str) -> RollupRows:
    batch = rollup_records(records)
    minutes = [
        (s[2], s[5], s[6], s[7]) for s in batch.summaries if s[4] == arm.value and s[1] == metric
    ]
    bins = [(b[2], b[5], b[6]) for b in batch.bins if b[4] == arm.value and b[1] == metric]
    return rollup_rows_from(minutes, bins)


def _arm_blocks(rows: RollupRows, first_minute: int, units: int) -> ArmBlocks:
    """Per-minute rollups as block-bootstrap units (rows of several models summed); unit =
    minute - first_minute."""
    u = rows.bin_minute - first_minute
    if u.size and (int(u.min()) < 0 or int(u.max()) >= units):
        raise ValueError("rollup minutes must lie in the window")
    lo = int(rows.bins.min()) if rows.bins.size else 0
    span = int(rows.bins.max()) - lo + 1 if rows.bins.size else 1
    key, inverse = np.unique(u * span + (rows.bins - lo), return_inverse=True)
    mu = rows.minute - first_minute
    return ArmBlocks(
        units=units,
        unit=key // span,
        bins=key % span + lo,
        counts=np.bincount(inverse, weights=rows.counts).astype(np.int64),
        unit_n=np.bincount(mu, weights=rows.n, minlength=units).astype(np.int64),
        unit_sum=np.bincount(mu, weights=rows.total, minlength=units).astype(np.float64),
    )


def _raw(records: list[RequestRecord], arm: Arm) -> tuple[FloatArray, npt.NDArray[np.int64]]:
    mine = [r for r in records if r.arm is arm]
    values = np.array([r.e2e_s for r in mine])
    units = np.array([minute_of(r.t_start) - minute_of(T0) for r in mine], dtype=np.int64)
    return values, units


def _exact_ci(
    values: tuple[FloatArray, FloatArray],
    units: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]],
    weights: FloatArray,
    block_units: int,
    stat: str,
) -> tuple[float, float]:
    reps = []
    for v, u in zip(values, units, strict=True):
        order = np.argsort(v)
        w = weights[:, u[order] // block_units]  # per-observation weight = its block's weight
        if stat == "mean":
            reps.append((w @ v[order]) / w.sum(axis=1))
            continue
        rank = np.floor((w.sum(axis=1) - 1) * QUANTILE_LEVELS[stat])
        idx = (np.cumsum(w, axis=1) <= rank[:, None]).sum(axis=1)
        reps.append(v[order][idx])
    lo, hi = np.quantile(reps[0] / reps[1], [0.025, 0.975])
    return float(lo), float(hi)


def test_rollup_block_cis_agree_with_the_exact_bootstrap_within_the_grid_bound() -> None:
    records = _records()
    arms = {arm: _arm_blocks(_rows(records, arm, "e2e"), minute_of(T0), MINUTES) for arm in Arm}
    raw = {arm: _raw(records, arm) for arm in Arm}
    block_units, resamples, seed = 3, 400, 11
    result = block_speedup_intervals(
        arms[Arm.BASELINE],
        arms[Arm.SPECULATIVE],
        statistics=STATISTICS,
        rng=np.random.default_rng(seed),
        resamples=resamples,
        block_units=block_units,
    )
    draws = np.random.default_rng(seed).poisson(1.0, size=(resamples, MINUTES // block_units))
    weights = draws.astype(np.float64)
    values = (raw[Arm.BASELINE][0], raw[Arm.SPECULATIVE][0])
    units = (raw[Arm.BASELINE][1], raw[Arm.SPECULATIVE][1])
    for stat in STATISTICS:
        lo, hi = _exact_ci(values, units, weights, block_units, stat)
        block = result.intervals[stat].block
        tol = 1e-12 if stat == "mean" else BOUND
        assert abs(math.log(block.lower / lo)) <= tol, stat
        assert abs(math.log(block.upper / hi)) <= tol, stat


def test_rollups_from_the_grid_equal_blocks_built_from_the_values() -> None:
    records = _records(seed=2)
    for arm in Arm:
        values, units = _raw(records, arm)
        from_rows = _arm_blocks(_rows(records, arm, "e2e"), minute_of(T0), MINUTES)
        from_values = ArmBlocks.from_values(units, values, MINUTES)
        assert from_rows.unit.tolist() == from_values.unit.tolist()
        assert from_rows.bins.tolist() == from_values.bins.tolist()
        assert from_rows.counts.tolist() == from_values.counts.tolist()
        assert np.allclose(from_rows.unit_sum, from_values.unit_sum, rtol=1e-12)


def test_sequential_bounds_from_histograms_agree_within_the_grid_bound() -> None:
    records = _records(seed=3)
    b, _ = _raw(records, Arm.BASELINE)
    s, _ = _raw(records, Arm.SPECULATIVE)
    exact = compare_sequential(b, s).to_dict()
    ranked = []
    for arm in (Arm.BASELINE, Arm.SPECULATIVE):
        blocks = _arm_blocks(_rows(records, arm, "e2e"), minute_of(T0), MINUTES)
        bins, counts = blocks.pooled()
        ranked.append(RankedArm.of_histogram(bin_centres(bins), counts))
    binned = compare_sequential_ranked(ranked[0], ranked[1]).to_dict()
    for key in ("p99_ratio_lower", "p99_ratio_upper", "median_ratio_lower", "median_ratio_upper"):
        e, r = exact[key], binned[key]
        assert isinstance(e, float) and isinstance(r, float)
        assert abs(math.log(r / e)) <= 2 * BOUND, key  # a ratio of two order statistics
    assert exact["verdict"] == binned["verdict"]


def test_rollup_window_has_the_compare_schema_and_names_what_it_lacks() -> None:
    records = _records(seed=4)
    arms = {
        metric: {
            arm: _arm_blocks(_rows(records, arm, metric), minute_of(T0), MINUTES) for arm in Arm
        }
        for metric in ("e2e", "ttft", "tpot")
    }
    settings = CompareSettings(resamples=300)
    moments = {arm: np.zeros((MINUTES, len(MOMENT_SUMS))) for arm in Arm}
    for _run, minute, _model, arm_name, *sums in rollup_records(records).moments:
        moments[Arm(arm_name)][minute - minute_of(T0)] += sums
    got = compare_rollup_window(
        arms, engine={}, settings=settings, rng=np.random.default_rng(0), moments=moments
    )
    assert got["source"] == "rollups" and got["unavailable"] == list(UNAVAILABLE_FROM_ROLLUPS)
    assert got["unavailable"] == []
    without = compare_rollup_window(
        arms, engine={}, settings=settings, rng=np.random.default_rng(0)
    )
    assert without["unavailable"] == ["adjusted"]
    assert without["metrics"]["e2e"]["adjusted"] is None
    raw_arrays = {
        arm: {
            "t_start": np.array([r.t_start for r in records if r.arm is arm]),
            "model": np.array([r.model for r in records if r.arm is arm], dtype=object),
            "status": np.array([200.0 for r in records if r.arm is arm]),
            "error_kind": np.array([None for r in records if r.arm is arm], dtype=object),
            "disconnected": np.zeros(sum(r.arm is arm for r in records), dtype=bool),
            "shadow": np.zeros(sum(r.arm is arm for r in records), dtype=bool),
            "pair_id": np.array([None for r in records if r.arm is arm], dtype=object),
            **{
                c: np.array([float(getattr(r, c)) for r in records if r.arm is arm])
                for c in ("e2e_s", "ttft_s", "tpot_s", "prompt_tokens", "output_tokens")
            },
        }
        for arm in Arm
    }
    exact = compare_window(raw_arrays, engine={}, settings=settings, rng=np.random.default_rng(0))
    for metric, block in got["metrics"].items():
        assert set(block) == set(exact["metrics"][metric]), metric
        for stat in STATISTICS:
            assert block["speedup"][stat]["status"] == "ok"
            e = exact["metrics"][metric]["summary"]["baseline"][stat]
            r = block["summary"]["baseline"][stat]
            assert r == pytest.approx(e, rel=0.01)  # linear vs lower order statistic at n=2400
        assert block["verdict"] == exact["metrics"][metric]["verdict"]
        # the secondary statistics from the histograms (`binned`): the rows' within the grid
        rows_block = exact["metrics"][metric]
        ranks, exact_ranks = block["rank_tests"], rows_block["rank_tests"]
        for key in ("hl_speedup", "hl_lower", "hl_upper"):
            assert ranks[key] == pytest.approx(exact_ranks[key], rel=2 * GRID_ERROR_BOUND), key
        assert ranks["mann_whitney_p"] == pytest.approx(exact_ranks["mann_whitney_p"], rel=0.05)
        for arm in Arm:
            got_out, want_out = block["outliers"][arm.value], rows_block["outliers"][arm.value]
            assert abs(got_out["count"] - want_out["count"]) <= 2, (metric, arm)
            assert got_out["high_fence"] == pytest.approx(want_out["high_fence"], rel=1e-3)
        needed, exact_needed = (
            block["samples_for_5pct_median"],
            rows_block["samples_for_5pct_median"],
        )
        assert needed is not None and exact_needed is not None
        assert needed == pytest.approx(exact_needed, rel=0.02)
        if metric != "e2e":
            assert block["adjusted"] is None and rows_block["adjusted"] is None
        else:  # the rows' regression from the minutes' moments; its CI from E2E's blocks
            adj, exact_adj = block["adjusted"], rows_block["adjusted"]
            assert adj is not None and exact_adj is not None
            assert adj["lower"] is not None and adj["upper"] is not None
            assert exact_adj["lower"] is not None and exact_adj["upper"] is not None
            assert adj["estimate"] == pytest.approx(exact_adj["estimate"], rel=1e-9)
            assert adj["n"] == exact_adj["n"] and adj["covariates"] == exact_adj["covariates"]
            assert (adj["method"], exact_adj["method"]) == ("block", "hc3")
            assert adj["lower"] < adj["estimate"] < adj["upper"]
            width = math.log(adj["upper"] / adj["lower"])
            assert width == pytest.approx(
                math.log(exact_adj["upper"] / exact_adj["lower"]), rel=0.3
            )
        # the exceedance P99 test runs on the minutes' histograms, conservatively (never above
        # the rows'; same minutes, same coarse-grid thresholds)
        seq, exact_seq = block["sequential"], exact["metrics"][metric]["sequential"]
        assert exact_seq is not None and "p99" in exact_seq
        assert seq["p99"]["binned"] and not exact_seq["p99"]["binned"]
        assert seq["p99"]["verdict"] == exact_seq["p99"]["verdict"]
        exact_p99: dict[str, Any] = dict(exact_seq["p99"])
        assert seq["p99"]["tests"] == exact_p99["tests"] == ["union_bound", "exceedance"]
        for side in ("exceedance_slower", "exceedance_faster"):
            exact_e = exact_p99[side]["statistic"]
            assert exact_e is not None
            assert seq["p99"][side]["statistic"] <= exact_e + 1e-12
    assert set(got) - {"source", "unavailable"} == set(exact)


@pytest.mark.parametrize("ratio", [1.05, 1.1, 1.13, 1.16])
def test_two_sample_p99_on_compacted_bins_stays_below_the_exact_statistic(ratio: float) -> None:
    """Coarse (0.5 %) entries stand at their centre fine bin (`loggrid.coarse_as_fine`); the
    binned two-sample test must bound them by the coarse bin's edges, or it claims more evidence
    than the values give. Worst case for the slower direction at tolerance 0.05: baseline values
    at the top of their coarse bins, speculative ones at the bottom (read as the centres, the
    speculative arm would look 0.25 % slower and the baseline 0.25 % faster than it is)."""
    rng = np.random.default_rng(int(ratio * 100))
    n = 6000

    def snapped(values: FloatArray, top: bool) -> FloatArray:
        edge = (coarse_bin(bin_index(values)) + top) * COARSE_FACTOR * GRID_LOG_WIDTH
        return np.asarray(np.exp(edge - 1e-7 if top else edge + 1e-7), dtype=np.float64)

    base = snapped(rng.lognormal(0.0, 0.5, n), top=True)
    spec = snapped(ratio * rng.lognormal(0.0, 0.5, n), top=False)
    t = np.sort(rng.uniform(0, MINUTES, n)).astype(np.int64)

    def compacted(values: FloatArray) -> ArmBlocks:
        fine = ArmBlocks.from_values(t, values, MINUTES)
        return dataclasses.replace(fine, bins=coarse_as_fine(coarse_bin(fine.bins)))

    arms: dict[str, dict[Arm, ArmBlocks]] = {
        m: {Arm.BASELINE: compacted(base), Arm.SPECULATIVE: compacted(spec)} for m in METRICS
    }
    settings = CompareSettings(resamples=100, p99_tolerance=0.05)
    got = compare_rollup_window(arms, engine={}, settings=settings, rng=rng)
    minute_s = np.asarray(t * 60.0, dtype=np.float64)
    times = (minute_s, minute_s)  # the rows' start times: the same minutes, the same tests
    exact = anytime_valid(base, spec, alpha=settings.alpha, tolerance=0.05, times=times)
    seq = got["metrics"]["e2e"]["sequential"]
    assert seq["p99"]["tests"] == exact["p99"].get("tests") == ["union_bound", "exceedance"]
    exact_p99: dict[str, Any] = dict(exact["p99"])
    for side in ("exceedance_slower", "exceedance_faster"):
        e = exact_p99[side]["statistic"]
        assert e is not None and seq["p99"][side]["statistic"] <= e + 1e-12, side
    if not exact_p99["exceedance_slower"]["rejected"]:
        assert not seq["p99"]["exceedance_slower"]["rejected"]
    # the pooled two-sample test's conservative bound on the same compacted bins
    # (mirrored designs' test; `_arms` gives its bins the coarse edges)
    (rank_b, bin_b, _), (rank_s, bin_s, _) = (
        _arms(arms["e2e"][a]) for a in (Arm.BASELINE, Arm.SPECULATIVE)
    )
    two = anytime_valid_binned(
        (rank_b, rank_s), (bin_b, bin_s), alpha=settings.alpha, tolerance=0.05
    )
    exact_two = anytime_valid(base, spec, alpha=settings.alpha, tolerance=0.05)
    for e_side, got_side in (
        (exact_two["p99"]["slower"], two["p99"]["slower"]),
        (exact_two["p99"]["faster"], two["p99"]["faster"]),
    ):
        e, g = e_side["statistic"], got_side["statistic"]
        assert e is not None and g is not None and g <= e + 1e-12


def test_the_exceedance_test_is_not_run_on_windows_with_hour_blocks() -> None:
    """Hour blocks (`piece_units` 60) are not minutes: the exceedance test is off at that tick
    (its earlier crossings stay in the whole-run memory) and no other test takes its place."""
    rng = np.random.default_rng(9)
    t = np.sort(rng.integers(0, MINUTES, 4000))

    def arm(scale: float, pieces: int) -> ArmBlocks:
        blocks = ArmBlocks.from_values(t, scale * rng.lognormal(0.0, 0.5, t.size), MINUTES)
        return dataclasses.replace(blocks, piece_units=pieces)

    settings = CompareSettings(resamples=100, p99_tolerance=0.05)
    for pieces, ran in ((1, True), (60, False)):
        arms: dict[str, dict[Arm, ArmBlocks]] = {
            m: {Arm.BASELINE: arm(1.0, pieces), Arm.SPECULATIVE: arm(1.5, pieces)} for m in METRICS
        }
        got = compare_rollup_window(arms, engine={}, settings=settings, rng=rng)
        p99 = got["metrics"]["e2e"]["sequential"]["p99"]
        assert p99["tests"] == ["union_bound", "exceedance"]
        assert p99["slower"]["statistic"] is None  # the two-sample test never runs on rollups
        assert (p99["exceedance_slower"]["statistic"] is not None) is ran
        assert p99["exceedance_slower"]["rejected"] is ran
