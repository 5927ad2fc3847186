"""The verdict as a value (`anytime.decision`): the rule (`Verdicts`), what a window keeps of its
evidence across ticks (`DecisionMemory`: the whole run's running intersection and sticky
crossings; a sliding window's evidence of its last span_s seconds; a reset on contradiction), and
the `sequential` block a decision renders (`Decision.to_result`)."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from typing import Literal

import pytest

from specproxy.stats.anytime.decision import (
    Decision,
    DecisionMemory,
    EProcess,
    Evidence,
    Verdicts,
    fresh,
)
from specproxy.stats.result import TwoSampleP99

ALPHA = 0.05
LEVEL = ALPHA / 2
BOUNDARY = math.log(1 / LEVEL)
KEY = ("all", "5m", "e2e")
Bounds = tuple[float, float]


def evidence(
    p99: Bounds = (0.9, 1.3),
    median: Bounds = (0.9, 1.1),
    crossed: tuple[bool, bool] = (False, False),
    test: str = "two_sample",
) -> Evidence:
    """One tick's evidence: the P99 and median ratio bounds and the design's e-process
    crossings (slower, faster), its statistic at the boundary when crossed, else 0.5."""

    def e(rejected: bool) -> EProcess:
        return EProcess(BOUNDARY if rejected else 0.5, BOUNDARY, rejected)

    assert test in ("two_sample", "exceedance")
    return Evidence(
        p99=p99,
        median=median,
        slower=e(crossed[0]),
        faster=e(crossed[1]),
        test="two_sample" if test == "two_sample" else "exceedance",
        level=LEVEL,
        tolerance=0.05,
        binned=True,
    )


def whole_run(memory: DecisionMemory, now: Evidence, at: float = 0.0) -> Decision:
    return memory.recall(KEY, now, at=at, span_s=None)


# ------------------------------------------------------------------------------------- the rule


@pytest.mark.parametrize(
    ("bounds", "crossed", "p99", "verdict", "decided_by"),
    [
        ((0.9, 1.2, 0.95, 1.05), (False, False), "inconclusive", "inconclusive", []),
        ((1.10, 1.3, 0.95, 1.05), (False, False), "slower", "slower", ["p99_union_bound"]),
        ((0.9, 1.2, 0.95, 1.05), (True, False), "slower", "slower", ["p99_two_sample"]),
        (
            (0.8, 0.94, 0.95, 1.05),
            (False, True),
            "faster",
            "faster",
            ["p99_union_bound", "p99_two_sample"],
        ),
        # a slower tail is never outweighed by a faster median
        ((0.9, 1.2, 0.80, 0.90), (True, False), "slower", "slower", ["p99_two_sample"]),
        ((0.9, 1.2, 0.80, 0.90), (False, False), "inconclusive", "faster", ["median"]),
        ((0.9, 1.2, 1.02, 1.10), (False, True), "faster", "slower", ["median"]),
        # evidence both ways on P99: neither claim
        ((1.10, 1.3, 0.95, 1.05), (False, True), "inconclusive", "inconclusive", []),
        # both the median and P99 faster
        ((0.8, 0.9, 0.80, 0.90), (True, True), "inconclusive", "faster", ["median"]),
        # within the tolerance: P99 bounds below 1 but not below 1 / 1.05
        ((0.8, 0.96, 0.95, 1.05), (False, False), "inconclusive", "inconclusive", []),
    ],
)
def test_the_rule(
    bounds: tuple[float, float, float, float],
    crossed: tuple[bool, bool],
    p99: str,
    verdict: str,
    decided_by: list[str],
) -> None:
    v = evidence(bounds[:2], bounds[2:], crossed).verdicts
    assert (v.p99, v.verdict, v.decided_by) == (p99, verdict, decided_by)


@pytest.mark.parametrize(
    ("p99_bounds", "crossed", "p99", "decided_by"),
    [
        ((0.9, 1.2), (True, False), "slower", ["exceedance"]),
        ((1.10, 1.3), (True, False), "slower", ["union_bound", "exceedance"]),
        ((0.9, 1.2), (False, True), "faster", ["exceedance"]),
        # the exceedance test against the union bound: a conflict, neither claim
        ((1.10, 1.3), (False, True), "inconclusive", []),
    ],
)
def test_the_rule_with_the_exceedance_test(
    p99_bounds: Bounds, crossed: tuple[bool, bool], p99: str, decided_by: list[str]
) -> None:
    v = evidence(p99_bounds, (0.95, 1.05), crossed, test="exceedance").verdicts
    assert (v.p99, v.p99_decided_by) == (p99, decided_by)
    assert v.decided_by == [f"p99_{name}" for name in decided_by]


def test_verdicts_is_the_rule_on_plain_flags() -> None:
    """Every combination of the seven flags: P99 slower iff a slower test and no faster one;
    the metric slower if P99 or the median is, else faster if either is."""
    for flags in itertools.product((False, True), repeat=6):
        us, uf, es, ef, ms, mf = flags
        v = Verdicts(us, uf, es, ef, "two_sample", ms, mf)
        slower, faster = us or es, uf or ef
        want_p99 = "inconclusive" if slower == faster else ("slower" if slower else "faster")
        assert v.p99 == want_p99 and v.p99_conflict == (slower and faster)
        median = "slower" if ms else ("faster" if mf else "inconclusive")
        assert v.median == median
        both = (want_p99, median)
        assert v.verdict == (
            "slower" if "slower" in both else "faster" if "faster" in both else "inconclusive"
        )


def test_empty_bounds_and_p99_both_ways_contradict_themselves() -> None:
    assert evidence((1.2, 1.1)).contradicts_itself()  # empty P99 bounds
    assert evidence(median=(1.1, 1.0)).contradicts_itself()
    assert evidence((1.10, 1.3), crossed=(False, True)).contradicts_itself()
    assert not evidence((1.10, 1.3), crossed=(True, False)).contradicts_itself()


# --------------------------------------------------------------------------------- the whole run


def test_slower_then_noise_does_not_flap_back() -> None:
    memory = DecisionMemory()
    ticks = [(1.02, 1.30), (1.08, 1.25), (1.03, 1.28), (1.09, 1.22)]  # the flap of issue 14
    seen = [whole_run(memory, evidence(b), at=60.0 * i).verdict for i, b in enumerate(ticks)]
    assert seen == ["inconclusive", "slower", "slower", "slower"]
    got = whole_run(memory, evidence((1.0, 2.0)), at=240.0)
    assert got.held.p99 == (1.09, 1.22) and got.now.p99 == (1.0, 2.0)
    assert got.memory == "intersected" and got.ticks == 5
    block = got.to_result()
    assert block["p99_ratio_lower"] == pytest.approx(1.09) and block["p99_ratio_upper"] == 1.22
    assert block["hysteresis"] == "intersected" and block["hysteresis_ticks"] == 5


def test_the_first_tick_holds_its_own_evidence() -> None:
    got = whole_run(DecisionMemory(), evidence((1.10, 1.20)))
    assert got.memory == "first" and got.ticks == 1 and got.held == got.now


def test_an_empty_intersection_restarts_the_memory_and_says_so() -> None:
    memory = DecisionMemory()
    whole_run(memory, evidence((1.10, 1.20)))
    got = whole_run(memory, evidence((0.80, 0.97)), at=60.0)
    assert got.memory == "reset" and got.ticks == 1
    assert got.held.p99 == (0.80, 0.97) and got.verdict == "inconclusive"
    # the memory restarted from that tick
    after = whole_run(memory, evidence((0.85, 1.5)), at=120.0)
    assert after.memory == "intersected" and after.ticks == 2 and after.held.p99 == (0.85, 0.97)


def test_missing_bounds_show_as_zero_and_none() -> None:
    block = fresh(evidence((0.0, math.inf), (0.0, math.inf))).to_result()
    assert block["p99_ratio_lower"] == 0.0 and block["p99_ratio_upper"] is None
    assert block["median_ratio_lower"] == 0.0 and block["median_ratio_upper"] is None


def test_union_bound_p99_faster_beyond_the_tolerance_is_a_faster_verdict() -> None:
    block = whole_run(DecisionMemory(), evidence((0.80, 0.95))).to_result()  # 0.95 < 1 / 1.05
    assert block["verdict"] == "faster" and block["decided_by"] == ["p99_union_bound"]
    block = whole_run(DecisionMemory(), evidence((0.80, 0.96))).to_result()  # within tolerance
    assert block["verdict"] == "inconclusive" and block["decided_by"] == []


def test_a_two_sample_crossing_on_the_whole_run_is_sticky() -> None:
    memory = DecisionMemory()
    seen, sticky = [], []
    for i, crossed in enumerate((False, True, False, False)):  # fell back below its boundary
        block = whole_run(memory, evidence(crossed=(crossed, False)), at=60.0 * i).to_result()
        seen.append(block["verdict"])
        sticky.append(block["p99"]["slower"]["sticky"])
    assert seen == ["inconclusive", "slower", "slower", "slower"]
    assert sticky == [False, False, True, True]
    assert block["p99_slower"] and block["p99"]["verdict"] == "slower"
    assert block["p99"]["decided_by"] == ["two_sample"]
    assert block["decided_by"] == ["p99_two_sample"]
    assert block["p99"]["slower"]["rejected"] and block["p99"]["slower"]["statistic"] == 0.5


def test_an_exceedance_crossing_on_the_whole_run_is_sticky() -> None:
    memory = DecisionMemory()
    seen, sticky = [], []
    for i, crossed in enumerate((False, True, False)):
        now = evidence(crossed=(crossed, False), test="exceedance")
        block = whole_run(memory, now, at=60.0 * i).to_result()
        seen.append(block["verdict"])
        sticky.append(block["p99"]["exceedance_slower"]["sticky"])
    assert seen == ["inconclusive", "slower", "slower"]
    assert sticky == [False, False, True]
    assert block["p99"]["decided_by"] == ["exceedance"]
    assert block["decided_by"] == ["p99_exceedance"]
    assert block["p99"]["exceedance_slower"]["rejected"]
    assert not block["p99"]["slower"]["rejected"]  # the two-sample test is not run on a split


def test_opposite_evidence_resets_the_memory_instead_of_keeping_a_stale_verdict() -> None:
    memory = DecisionMemory()
    whole_run(memory, evidence(crossed=(True, False)))
    got = whole_run(memory, evidence(crossed=(False, True)), at=60.0)  # now faster crosses
    block = got.to_result()
    assert block["hysteresis"] == "reset" and block["hysteresis_ticks"] == 1
    assert block["verdict"] == "faster" and block["p99"]["decided_by"] == ["two_sample"]
    assert not block["p99"]["slower"]["rejected"]
    # a remembered union-bound "slower" against a new two-sample "faster" is a conflict too
    memory = DecisionMemory()
    whole_run(memory, evidence((1.10, 1.3)))
    got = whole_run(memory, evidence((0.9, 1.3), crossed=(False, True)), at=60.0)
    assert got.memory == "reset" and got.verdict == "faster"


def test_conflicting_evidence_within_one_tick_is_inconclusive() -> None:
    for decision in (
        fresh(evidence((1.10, 1.3), crossed=(False, True))),
        whole_run(DecisionMemory(), evidence((1.10, 1.3), crossed=(False, True))),
    ):
        block = decision.to_result()
        assert block["verdict"] == "inconclusive" and block["p99"]["decided_by"] == []


def test_a_new_leader_starts_from_the_stored_evidence() -> None:
    memory = DecisionMemory()
    memory.seed({KEY: (0.0, evidence((1.10, 1.3)))})
    got = whole_run(memory, evidence((0.9, 1.2)), at=60.0)
    assert got.memory == "intersected" and got.ticks == 2
    assert got.held.p99 == (1.10, 1.2) and got.verdict == "slower"
    window = DecisionMemory()
    window.seed({KEY: (0.0, evidence((1.10, 1.3)))})
    assert window.recall(KEY, evidence(), at=60.0, span_s=300.0).verdict == "slower"
    other = ("all", "5m", "ttft")  # keys are kept apart
    assert window.recall(other, evidence(), at=60.0, span_s=300.0).memory == "first"


# ------------------------------------------------------------------------------ sliding windows

SPAN = 300.0  # a 5-minute window, a tick a minute


def test_a_sliding_window_keeps_a_verdict_for_its_span_and_drops_it_after() -> None:
    """The tick whose evidence said "slower" stays held while the requests that gave it may
    still be in the window (its span), and is dropped after."""
    for slower in (evidence((1.10, 1.3)), evidence(crossed=(True, False), test="exceedance")):
        memory = DecisionMemory()
        seen = [memory.recall(KEY, slower, at=0.0, span_s=SPAN).verdict]
        noise = evidence((0.95, 1.3), test=slower.test)
        for at in range(60, 421, 60):
            got = memory.recall(KEY, noise, at=float(at), span_s=SPAN)
            seen.append(got.verdict)
            assert got.ticks == min(at // 60, 4) + 1  # the ticks of the last SPAN seconds
            if at < SPAN:
                assert got.held.slower.rejected == slower.slower.rejected
        assert seen == ["slower"] * 5 + ["inconclusive"] * 3, slower


def test_a_sliding_window_never_flaps_on_alternating_noise_within_its_span() -> None:
    """Evidence that alternates between "slower" and not from tick to tick, more often than the
    span: the verdict turns slower once and stays so while a slower tick is within the span,
    then turns back once: never slower -> inconclusive -> slower."""
    for slower, noise in (
        (evidence((1.08, 1.25)), evidence((1.03, 1.28))),
        (
            evidence(crossed=(True, False), test="exceedance"),
            evidence(test="exceedance"),
        ),
    ):
        memory = DecisionMemory()
        seen = []
        for i in range(20):
            now = slower if i % 2 and i < 12 else noise  # alternation ends after tick 11
            seen.append(memory.recall(KEY, now, at=60.0 * i, span_s=SPAN).verdict)
        flips = [i for i in range(1, 20) if seen[i] != seen[i - 1]]
        assert seen[0] == "inconclusive" and seen[1] == "slower"
        assert flips == [1, 16], seen  # the last slower tick (11) leaves at 11 + 5
        assert all(v == "slower" for v in seen[1:16])


def test_a_sliding_window_intersects_the_bounds_of_its_span() -> None:
    memory = DecisionMemory()
    for i, bounds in enumerate(((0.9, 1.4), (1.0, 1.3), (0.95, 1.2))):
        got = memory.recall(KEY, evidence(bounds), at=60.0 * i, span_s=SPAN)
    assert got.held.p99 == (1.0, 1.2) and got.memory == "intersected" and got.ticks == 3
    later = memory.recall(KEY, evidence((0.9, 1.5)), at=360.0, span_s=SPAN)
    assert later.held.p99 == (0.95, 1.2) and later.ticks == 2  # ticks at 0 and 60 have left


def test_a_sliding_window_resets_on_contradiction() -> None:
    memory = DecisionMemory()
    memory.recall(KEY, evidence(crossed=(True, False)), at=0.0, span_s=SPAN)
    got = memory.recall(KEY, evidence(crossed=(False, True)), at=60.0, span_s=SPAN)
    assert got.memory == "reset" and got.ticks == 1 and got.verdict == "faster"
    after = memory.recall(KEY, evidence(), at=120.0, span_s=SPAN)
    assert after.verdict == "faster" and after.ticks == 2  # the slower tick was forgotten


# ---------------------------------------------------------------------------- the rendered block


def test_to_result_renders_every_field_of_the_sequential_block() -> None:
    memory = DecisionMemory()
    memory.recall(KEY, evidence((1.10, 1.3), (1.01, 1.2), test="exceedance"), at=0.0, span_s=None)
    now = evidence((1.0, 1.25), (0.98, 1.15), crossed=(True, False), test="exceedance")
    decision = memory.recall(KEY, now, at=60.0, span_s=None)
    never: TwoSampleP99 = {
        "statistic": None,
        "boundary": BOUNDARY,
        "rejected": False,
        "sticky": False,
    }
    assert decision.to_result() == {
        "p99_ratio_lower": 1.10,
        "p99_ratio_upper": 1.25,
        "median_ratio_lower": 1.01,
        "median_ratio_upper": 1.15,
        "p99_slower": True,
        "median_faster": False,
        "median_slower": True,
        "verdict": "slower",
        "hysteresis": "intersected",
        "hysteresis_ticks": 2,
        "decided_by": ["p99_union_bound", "p99_exceedance", "median"],
        "p99": {
            "verdict": "slower",
            "decided_by": ["union_bound", "exceedance"],
            "level": LEVEL,
            "union_bound_slower": True,
            "union_bound_faster": False,
            "slower": never,  # the two-sample test is not run on split traffic
            "faster": never,
            "binned": True,
            "tests": ["union_bound", "exceedance"],
            "exceedance_slower": {
                "statistic": BOUNDARY,
                "boundary": BOUNDARY,
                "rejected": True,
                "sticky": False,
            },
            "exceedance_faster": {
                "statistic": 0.5,
                "boundary": BOUNDARY,
                "rejected": False,
                "sticky": False,
            },
        },
    }
    block = fresh(evidence()).to_result()
    assert block["hysteresis"] is None and block["hysteresis_ticks"] == 0
    assert block["p99"]["tests"] == ["union_bound", "two_sample"]
    assert block["p99"]["exceedance_slower"] == never
    assert block["p99"]["slower"] == {
        "statistic": 0.5,
        "boundary": BOUNDARY,
        "rejected": False,
        "sticky": False,
    }
    none = EProcess(None, BOUNDARY, False)
    not_run = Evidence((0.9, 1.1), (0.9, 1.1), none, none, "exceedance", LEVEL, 0.05, True)
    assert fresh(not_run).to_result()["p99"]["exceedance_slower"] == never


def test_stored_evidence_reads_back_as_it_was_held() -> None:
    """A new leader seeds its memory from the last stored result: `Evidence.of_result` of a
    rendered decision is the evidence it held (bounds, crossings, the design's test)."""
    tests: tuple[Literal["exceedance", "two_sample"], ...] = ("exceedance", "two_sample")
    for test in tests:
        held = Evidence(
            p99=(1.07, 1.4),
            median=(0.0, math.inf),
            slower=EProcess(5.1, math.log(40.0), True),
            faster=EProcess(None, math.log(40.0), False),
            test=test,
            level=0.025,
            tolerance=0.05,
            binned=True,
        )
        now = dataclasses.replace(held, slower=EProcess(2.0, math.log(40.0), False))
        rendered = json.loads(json.dumps(Decision(held, now, "intersected", 4).to_result()))
        back = Evidence.of_result(rendered, 0.05)
        assert back is not None and back.verdicts.p99 == "slower"
        assert back == dataclasses.replace(held, slower=EProcess(2.0, math.log(40.0), True))
    assert Evidence.of_result({"p99_ratio_lower": None}, 0.05) is None  # type: ignore[typeddict-item]
