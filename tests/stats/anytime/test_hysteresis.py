"""Whole-run verdicts follow the running intersection of the anytime-valid bounds: no flapping."""

from __future__ import annotations

from typing import Any, cast

import pytest
from specproxy.stats.anytime.hysteresis import VerdictMemory

from specproxy.stats.result import StatsResult


def _two_sample(rejected: bool) -> dict[str, Any]:
    return {"statistic": 3.0 if rejected else 0.5, "boundary": 3.0, "rejected": rejected}


def _result(
    p99: tuple[float | None, float | None],
    window: str = "all",
    crossed: tuple[bool, bool] | None = None,
) -> StatsResult:
    seq: dict[str, Any] = {
        "p99_ratio_lower": p99[0],
        "p99_ratio_upper": p99[1],
        "median_ratio_lower": 0.9,
        "median_ratio_upper": 1.1,
        "p99_slower": False,
        "median_faster": False,
        "median_slower": False,
        "verdict": "inconclusive",
    }
    if crossed is not None:  # the two-sample P99 test's (slower, faster) rejections this tick
        seq["p99"] = {
            "verdict": "inconclusive",
            "decided_by": [],
            "slower": _two_sample(crossed[0]),
            "faster": _two_sample(crossed[1]),
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
    r = _result((0.80, 0.97))
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


def _seq(r: StatsResult, window: str = "all") -> dict[str, Any]:
    got = r["results"]["all"][window]["metrics"]["e2e"]["sequential"]
    assert got is not None
    return cast(dict[str, Any], got)


def test_union_bound_p99_faster_beyond_the_tolerance_is_a_faster_verdict() -> None:
    r = _result((0.80, 0.95))  # 0.95 < 1 / 1.05
    VerdictMemory().apply(r, tolerance=0.05)
    assert _verdict(r) == "faster" and _seq(r)["decided_by"] == ["p99_union_bound"]
    r = _result((0.80, 0.96))  # within the tolerance
    VerdictMemory().apply(r, tolerance=0.05)
    assert _verdict(r) == "inconclusive" and _seq(r)["decided_by"] == []


def test_a_two_sample_crossing_on_the_whole_run_is_sticky() -> None:
    memory = VerdictMemory()
    seen, sticky = [], []
    for crossed in (False, True, False, False):  # the statistic fell back below its boundary
        r = _result((0.9, 1.3), crossed=(crossed, False))
        memory.apply(r, tolerance=0.05)
        seen.append(_verdict(r))
        sticky.append(_seq(r)["p99"]["slower"]["sticky"])
    assert seen == ["inconclusive", "slower", "slower", "slower"]
    assert sticky == [False, False, True, True]
    got = _seq(r)
    assert got["p99_slower"] and got["p99"]["verdict"] == "slower"
    assert got["p99"]["decided_by"] == ["two_sample"] and got["decided_by"] == ["p99_two_sample"]
    assert got["p99"]["slower"]["rejected"] and got["p99"]["slower"]["statistic"] == 0.5


def test_an_exceedance_crossing_on_the_whole_run_is_sticky() -> None:
    memory = VerdictMemory()
    seen, sticky = [], []
    for crossed in (False, True, False):
        r = _result((0.9, 1.3), crossed=(False, False))
        p99 = _seq(r)["p99"]
        p99["exceedance_slower"] = _two_sample(crossed)
        p99["exceedance_faster"] = _two_sample(False)
        memory.apply(r, tolerance=0.05)
        seen.append(_verdict(r))
        sticky.append(_seq(r)["p99"]["exceedance_slower"]["sticky"])
    assert seen == ["inconclusive", "slower", "slower"]
    assert sticky == [False, False, True]
    got = _seq(r)
    assert got["p99"]["decided_by"] == ["exceedance"] and got["decided_by"] == ["p99_exceedance"]
    assert got["p99"]["exceedance_slower"]["rejected"] and not got["p99"]["slower"]["rejected"]


def test_sliding_window_crossings_are_not_remembered() -> None:
    memory = VerdictMemory()
    memory.apply(_result((0.9, 1.3), window="5m", crossed=(True, False)), tolerance=0.05)
    r = _result((0.9, 1.3), window="5m", crossed=(False, False))
    memory.apply(r, tolerance=0.05)
    assert _verdict(r, "5m") == "inconclusive"


def test_opposite_evidence_resets_the_memory_instead_of_keeping_a_stale_verdict() -> None:
    memory = VerdictMemory()
    memory.apply(_result((0.9, 1.3), crossed=(True, False)), tolerance=0.05)
    r = _result((0.9, 1.3), crossed=(False, True))  # the faster direction crosses now
    memory.apply(r, tolerance=0.05)
    got = _seq(r)
    assert got["hysteresis"] == "reset" and got["hysteresis_ticks"] == 1
    assert _verdict(r) == "faster" and got["p99"]["decided_by"] == ["two_sample"]
    assert not got["p99"]["slower"]["rejected"]
    # a remembered union-bound "slower" against a new two-sample "faster" is a conflict too
    memory = VerdictMemory()
    memory.apply(_result((1.10, 1.3)), tolerance=0.05)
    r = _result((0.9, 1.3), crossed=(False, True))
    memory.apply(r, tolerance=0.05)
    assert _seq(r)["hysteresis"] == "reset" and _verdict(r) == "faster"


def test_conflicting_evidence_within_one_tick_is_inconclusive() -> None:
    r = _result((1.10, 1.3), crossed=(False, True))
    VerdictMemory().apply(r, tolerance=0.05)
    assert _verdict(r) == "inconclusive" and _seq(r)["p99"]["decided_by"] == []
