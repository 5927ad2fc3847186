"""Rollups of records: one summary per key, exact sums, additive merge."""

from __future__ import annotations

import math

import numpy as np

from specproxy.loggrid import bin_index
from specproxy.records import Arm, RequestRecord
from specproxy.rollup import merge_batches, minute_of, rollup_records


def _rec(i: int, t: float, e2e: float, **extra: object) -> RequestRecord:
    values: dict[str, object] = {
        "request_id": f"r{i}",
        "run_id": "run",
        "arm": Arm.BASELINE,
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
    e2e = [s for s in batch.summaries if s[4] == "e2e"]
    assert e2e == [("run", 2, "m", "baseline", "e2e", 4, sum(values), sum(v * v for v in values))]
    bins = {b: c for *_k, b, c in (r for r in batch.bins if r[4] == "e2e")}
    expected_bins, counts = np.unique(bin_index(np.array(values)), return_counts=True)
    assert bins == dict(zip(expected_bins.tolist(), counts.tolist(), strict=True))
    assert not [s for s in batch.summaries if s[4] != "e2e"]  # no ttft/tpot values given


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
    ]
    batch = rollup_records(recs)
    assert [s[4] for s in batch.summaries] == ["e2e"]
    assert batch.summaries[0][5] == 1
