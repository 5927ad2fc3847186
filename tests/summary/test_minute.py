"""Rollups of records: one summary per key, numpy's sums in pure Python, additive merge."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specproxy.records import RequestRecord
from specproxy.summary.conditions import CONDITION_METRICS
from specproxy.summary.histogram import bin_index, coarse_as_fine, coarse_bin
from specproxy.summary.minute import (
    ROLLUP_METRICS,
    minute_of,
    moment_values,
    pairwise_sum,
    rollup_records,
)
from tests.summary.helpers import merge_batches


def _rec(i: int, t: float, e2e: float, **extra: object) -> RequestRecord:
    values: dict[str, object] = {
        "request_id": f"r{i}",
        "run_id": "run",
        "arm": "baseline",
        "t_start": t,
        "model": "m",
        "endpoint": "completions",
        "stream": False,
        "status": 200,
        "e2e_s": e2e,
        "upstream_s": e2e,
    }
    values.update(extra)
    return RequestRecord(**values)  # type: ignore[arg-type]


def test_summary_and_bins_of_one_minute() -> None:
    values = [0.5, 0.5, 1.25, 3.0]
    recs = [_rec(i, 120.0 + i, v) for i, v in enumerate(values)]
    batch = rollup_records(recs)
    e2e = [s for s in batch.summaries if s[1] == "e2e"]
    assert e2e == [("run", "e2e", 2, "m", "baseline", 4, sum(values), sum(v * v for v in values))]
    bins = [(b, c) for *_k, b, c in (r for r in batch.bins if r[1] == "e2e")]
    expected_bins, counts = np.unique(bin_index(np.array(values)), return_counts=True)
    assert bins == list(zip(expected_bins.tolist(), counts.tolist(), strict=True))  # bin order
    compared = [s for s in batch.summaries if s[1] in ROLLUP_METRICS]
    assert [s[1] for s in compared] == ["e2e"]  # no ttft/tpot values given


def test_minutes_are_floor_of_t_over_60() -> None:
    assert minute_of(59.999) == 0
    assert minute_of(60.0) == 1
    assert minute_of(-0.5) == -1


def test_batches_merge_to_the_rollup_of_all_records() -> None:
    rng = np.random.default_rng(1)
    recs = [_rec(i, float(i), float(rng.lognormal()), ttft_s=0.1) for i in range(500)]
    whole = rollup_records(recs)
    merged = merge_batches([rollup_records(recs[:123]), rollup_records(recs[123:])])
    assert sorted(merged.bins) == sorted(whole.bins)
    for a, b in zip(sorted(merged.summaries), sorted(whole.summaries), strict=True):
        assert a[:6] == b[:6]
        assert math.isclose(a[6], b[6], rel_tol=1e-12) and math.isclose(a[7], b[7], rel_tol=1e-12)


def test_unusable_and_non_positive_values_are_left_out() -> None:
    recs = [
        _rec(1, 0.0, 1.0, tpot_s=0.0, ttft_s=math.nan),
        _rec(2, 0.0, 1.0, status=500),
        _rec(3, 0.0, 1.0, shadow=True),
        _rec(4, 0.0, 1.0, rerouted_from="speculative", reroute_reason="down"),  # failed open
    ]
    batch = rollup_records(recs)
    assert [(s[1], s[3]) for s in batch.summaries] == [
        ("e2e", "m"),
        ("cond_e2e", "temperature=default"),  # the one condition every request states
    ]
    assert [s[5] for s in batch.summaries] == [1, 1]


def test_each_condition_a_request_states_is_a_key_of_its_e2e_and_tpot_on_the_coarse_grid() -> None:
    """Issue 26: the conditions are summary keys. A request is rolled up once per condition it
    states (load, prompt and output band, temperature band, category), under cond_e2e and
    cond_tpot, binned at the centre of its coarse bin; a request stating none has only its
    temperature ("default")."""
    full = dict(
        endpoint_in_flight=3,
        prompt_tokens=200,
        output_tokens=40,
        temperature=0.0,
        category="code",
        tpot_s=0.02,
    )
    recs = [
        _rec(0, 60.0, 1.0, **full),
        _rec(1, 61.0, 2.0, **full),
        _rec(2, 62.0, 4.0, **{**full, "endpoint_in_flight": 40, "category": None}),
        _rec(3, 63.0, 8.0),  # nothing stated
    ]
    batch = rollup_records(recs)
    keys = {(s[1], s[3]): (s[5], s[6]) for s in batch.summaries if s[1] in CONDITION_METRICS}
    assert keys == {
        ("cond_e2e", "load=3"): (2, 3.0),
        ("cond_e2e", "load=40"): (1, 4.0),  # 40-47: a quarter of the doubling from 32
        ("cond_e2e", "prompt=128-511"): (3, 7.0),
        ("cond_e2e", "output=32-127"): (3, 7.0),
        ("cond_e2e", "temperature=0"): (3, 7.0),
        ("cond_e2e", "temperature=default"): (1, 8.0),
        ("cond_e2e", "category=code"): (2, 3.0),
        ("cond_tpot", "load=3"): (2, 0.04),
        ("cond_tpot", "load=40"): (1, 0.02),
        ("cond_tpot", "prompt=128-511"): (3, pytest.approx(0.06)),
        ("cond_tpot", "output=32-127"): (3, pytest.approx(0.06)),
        ("cond_tpot", "temperature=0"): (3, pytest.approx(0.06)),
        ("cond_tpot", "category=code"): (2, 0.04),
    }
    bins = {(r[1], r[3], r[5]): r[6] for r in batch.bins if r[1] == "cond_e2e"}
    centre = coarse_as_fine(coarse_bin(bin_index(np.array([1.0, 2.0]))))
    assert {b: c for (_m, k, b), c in bins.items() if k == "load=3"} == {
        int(centre[0]): 1,
        int(centre[1]): 1,
    }


def test_moments_are_the_regression_sums_of_requests_with_both_token_counts() -> None:
    recs = [
        _rec(0, 60.0, 2.0, output_tokens=10, prompt_tokens=100),
        _rec(1, 61.0, 4.0, output_tokens=30, prompt_tokens=50),
        _rec(2, 62.0, 3.0, output_tokens=20),  # no prompt count: left out
        _rec(3, 63.0, 3.0, output_tokens=0, prompt_tokens=5),  # no output token: left out
        _rec(4, 64.0, 5.0, output_tokens=8, prompt_tokens=9, status=500),  # unusable
        _rec(5, 180.0, 1.5, output_tokens=7, prompt_tokens=3, arm="speculative"),
    ]
    batch = rollup_records(recs)
    by_key = {row[:4]: row[4:] for row in batch.moments}
    assert set(by_key) == {("run", 1, "m", "baseline"), ("run", 3, "m", "speculative")}
    y, u, v = np.log([2.0, 4.0]), np.log([10.0, 30.0]), np.log([100.0, 50.0])
    want = [2, u.sum(), v.sum(), u @ u, v @ v, u @ v, y.sum(), u @ y, v @ y, y @ y]
    got = by_key[("run", 1, "m", "baseline")]
    assert got[0] == 2 and isinstance(got[0], int)
    assert np.allclose(got, want, rtol=1e-12)
    halves = merge_batches([rollup_records(recs[:1]), rollup_records(recs[1:])]).moments
    assert {r[:4]: r[4:] for r in halves}.keys() == by_key.keys()
    for row in halves:
        assert np.allclose(row[4:], by_key[row[:4]], rtol=1e-12)


@pytest.mark.parametrize("n", [*range(20), 127, 128, 129, 1000, 8191, 8192, 8193, 50_001])
def test_pairwise_sum_is_numpys_sum_bit_for_bit(n: int) -> None:
    rng = np.random.default_rng(n)
    for scale in (
        rng.lognormal(0.0, 1.0, n),
        rng.normal(0.0, 1.0, n) * 10.0 ** rng.integers(-8, 8, n),
    ):
        assert pairwise_sum(scale.tolist()) == float(np.sum(scale))
    assert pairwise_sum([]) == 0.0


def test_rollup_sums_are_numpys() -> None:
    """The numpy rollup this pure one replaced: `v.sum()` bit for bit, `v @ v` and the moments
    (numpy's log and BLAS dot may round differently) to 1e-12."""
    rng = np.random.default_rng(7)
    n = 3000
    e2e = rng.lognormal(0.0, 0.7, n)
    out = rng.integers(1, 500, n)
    prompt = rng.integers(1, 3000, n)
    recs = [
        _rec(
            i,
            60.0 * (1 + i % 2),
            float(e2e[i]),
            output_tokens=int(out[i]),
            prompt_tokens=int(prompt[i]),
        )
        for i in range(n)
    ]
    batch = rollup_records(recs)
    for _run, metric, minute, *_key, count, total, total_sq in batch.summaries:
        if metric in CONDITION_METRICS:
            continue  # a slice of the minute per condition key
        v = e2e[(np.arange(n) % 2) == minute - 1]
        assert count == v.size
        assert total == float(v.sum())
        assert total_sq == pytest.approx(float(v @ v), rel=1e-12)
    for _run, minute, _model, _arm, *sums in batch.moments:
        sel = (np.arange(n) % 2) == minute - 1
        y, u, w = np.log(e2e[sel]), np.log(out[sel]), np.log(prompt[sel])
        want = [y.size, u.sum(), w.sum(), u @ u, w @ w, u @ w, y.sum(), u @ y, w @ y, y @ y]
        assert sums == pytest.approx(want, rel=1e-12)
    assert moment_values([2.0], [3.0], [4.0])[0] == 1.0
