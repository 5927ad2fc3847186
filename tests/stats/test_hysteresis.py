"""Whole-run verdicts follow the running intersection of the anytime-valid bounds: no flapping."""

from __future__ import annotations

from typing import Any, cast

import pytest

from specproxy.stats.hysteresis import VerdictMemory
from specproxy.stats.result import StatsResult


def _result(p99: tuple[float | None, float | None], window: str = "all") -> StatsResult:
    seq = {
        "p99_ratio_lower": p99[0],
        "p99_ratio_upper": p99[1],
        "median_ratio_lower": 0.9,
        "median_ratio_upper": 1.1,
        "p99_slower": False,
        "median_faster": False,
        "median_slower": False,
        "verdict": "inconclusive",
    }
    block: dict[str, Any] = {"sequential": seq, "verdict": "inconclusive"}
    return cast(StatsResult, {"results": {"all": {window: {"metrics": {"e2e": block}}}}})


def _verdict(r: StatsResult, window: str = "all") -> str:
    return str(r["results"]["all"][window]["metrics"]["e2e"]["verdict"])


def test_slower_then_noise_does_not_flap_back() -> None:
    memory = VerdictMemory()
    ticks = [(1.02, 1.30), (1.08, 1.25), (1.03, 1.28), (1.09, 1.22)]  # the flap of issue 14
    seen = []
    for lo, hi in ticks:
        r = _result((lo, hi))
        memory.apply(r, tolerance=0.05)
        seen.append(_verdict(r))
    assert seen == ["inconclusive", "slower", "slower", "slower"]
    seq = _result((1.0, 2.0))
    memory.apply(seq, tolerance=0.05)
    got = seq["results"]["all"]["all"]["metrics"]["e2e"]["sequential"]
    assert got is not None
    assert got["p99_ratio_lower"] == pytest.approx(1.09) and got["p99_ratio_upper"] == 1.22
    assert got.get("hysteresis") == "intersected" and got.get("hysteresis_ticks") == 5


def test_an_empty_intersection_restarts_the_memory_and_says_so() -> None:
    memory = VerdictMemory()
    memory.apply(_result((1.10, 1.20)), tolerance=0.05)
    r = _result((0.80, 0.95))
    memory.apply(r, tolerance=0.05)
    got = r["results"]["all"]["all"]["metrics"]["e2e"]["sequential"]
    assert got is not None and got.get("hysteresis") == "reset"
    assert got["p99_ratio_lower"] == 0.8 and _verdict(r) == "inconclusive"


def test_sliding_windows_and_missing_bounds_are_left_alone() -> None:
    memory = VerdictMemory()
    r = _result((1.2, 1.3), window="5m")
    memory.apply(r, tolerance=0.05)
    assert _verdict(r, "5m") == "inconclusive"  # as computed: not one growing sequence
    r = _result((None, None))
    memory.apply(r, tolerance=0.05)
    got = r["results"]["all"]["all"]["metrics"]["e2e"]["sequential"]
    assert got is not None and got["p99_ratio_lower"] == 0.0 and got["p99_ratio_upper"] is None
