"""The typed stats result (`stats.result`): the job's output matches the declared schema key for
key, at every level, and carries the one list of statistics and metrics in its settings."""

from __future__ import annotations

import json
import types
import typing
from typing import Any, is_typeddict

import pytest

from specproxy.config import StatsConfig
from specproxy.stats.job import tick
from specproxy.stats.job.tick import compute_stats
from specproxy.stats.result import (
    METRICS,
    STATISTICS,
    StatsResult,
    to_json,
)
from specproxy.store.memory import MemoryStore
from tests.stats.job.runs import RUN, WARMUP

CFG = StatsConfig(windows_s=(60.0, None), resamples=200)


def _check(value: Any, hint: Any, path: str) -> int:
    """Walk `value` along the type `hint`; assert every TypedDict has exactly its declared keys.
    Returns how many TypedDicts were checked."""
    origin = typing.get_origin(hint)
    if is_typeddict(hint):
        assert isinstance(value, dict), path
        # NotRequired read from the hints: Python 3.11 puts every key of a module with
        # postponed annotations in __required_keys__
        extras = typing.get_type_hints(hint, include_extras=True)
        optional = {k for k, t in extras.items() if typing.get_origin(t) is typing.NotRequired}
        required = set(extras) - optional
        assert required <= value.keys() <= set(extras), (path, sorted(value))
        hints = typing.get_type_hints(hint)
        return 1 + sum(_check(value[k], hints[k], f"{path}.{k}") for k in value)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None:
            assert type(None) in args, path
            return 0
        (inner,) = [a for a in args if a is not type(None)]
        return _check(value, inner, path)
    if origin is dict:
        _, inner = typing.get_args(hint)
        return sum(_check(v, inner, f"{path}[{k}]") for k, v in value.items())
    if origin is list:
        (inner,) = typing.get_args(hint)
        return sum(_check(v, inner, f"{path}[]") for v in value)
    return 0


@pytest.mark.parametrize("rows_max", [100_000, 0], ids=["rows", "summaries"])
async def test_the_job_result_has_exactly_the_declared_keys(
    store: MemoryStore, rows_max: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tick, "ROWS_MAX", rows_max)
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, window_end=1160.0)
    checked = _check(result, StatsResult, "result")
    # 3 models x 2 windows, each with metrics, speedups per statistic, outliers per arm, ...
    assert checked > 3 * 2 * len(METRICS) * len(STATISTICS)
    window = result["results"]["all"]["all"]
    assert set(window["metrics"]) == set(METRICS)
    for block in window["metrics"].values():
        assert set(block["speedup"]) == set(STATISTICS)
        for arm in ("speculative", "baseline"):
            assert set(block["summary"][arm]) == set(STATISTICS)


async def test_settings_carry_the_lists_and_json_round_trips(store: MemoryStore) -> None:
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, window_end=1160.0)
    settings = result["settings"]
    assert settings.get("statistics") == ["median", "mean", "p90", "p99"]
    assert settings.get("metrics") == {
        "e2e": {"column": "e2e_s", "label": "E2E", "title": "End-to-end latency"},
        "ttft": {"column": "ttft_s", "label": "TTFT", "title": "Time to first token"},
        "tpot": {"column": "tpot_s", "label": "TPOT", "title": "Time per output token"},
    }
    assert json.loads(to_json(result)) == json.loads(json.dumps(result))
