"""The rollout gate on a window's E2E evidence: slower fails, faster or not slower passes, and
anything else (no samples, evidence that decides neither) waits."""

from __future__ import annotations

import math
from typing import Any, cast

import pytest

from specproxy.stats.anytime.decision import EProcess, Evidence, fresh
from specproxy.stats.gate import window_gate
from specproxy.stats.result import GateState, WindowComparison

TOL = 0.05
NOT_RUN = EProcess(None, math.log(40.0), False)
REJECTED = EProcess(5.0, math.log(40.0), True)


def window(
    p99: tuple[float, float] = (0.0, math.inf),
    median: tuple[float, float] = (0.0, math.inf),
    slower: EProcess = NOT_RUN,
    faster: EProcess = NOT_RUN,
) -> WindowComparison:
    """A window whose E2E block carries the sequential block and verdict the job's own rule
    (`Decision.to_result`) makes of this evidence."""
    evidence = Evidence(p99, median, slower, faster, "exceedance", 0.025, TOL, True)
    decision = fresh(evidence)
    block: dict[str, Any] = {
        "n": {"baseline": 500, "speculative": 500},
        "sequential": decision.to_result(),
        "verdict": decision.verdict,
    }
    return cast(WindowComparison, {"metrics": {"e2e": block}})


@pytest.mark.parametrize(
    ("win", "state", "words"),
    [
        (window(p99=(1.2, 1.6)), "fail", "E2E P99 slower"),
        (window(slower=REJECTED), "fail", "exceedance"),
        (window(median=(1.01, 1.1)), "fail", "E2E median slower"),
        # a faster median never outweighs a slower tail
        (window(p99=(1.2, 1.6), median=(0.5, 0.7)), "fail", "P99 slower"),
        (window(median=(0.6, 0.8)), "pass", "E2E median faster"),
        (window(p99=(0.5, 0.9)), "pass", "E2E P99 faster"),
        # not slower: both upper bounds below 1 + tolerance, the verdict still inconclusive
        (window(p99=(0.9, 1.04), median=(0.97, 1.03)), "pass", "not slower"),
        (window(p99=(0.9, 1.06), median=(0.97, 1.03)), "wait", "P99 ratio upper bound 1.060"),
        (window(p99=(0.9, 1.04), median=(0.97, 1.05)), "wait", "median ratio upper bound 1.050"),
        (window(), "wait", "upper bound n/a"),
    ],
)
def test_the_gate_follows_the_e2e_evidence(
    win: WindowComparison, state: GateState, words: str
) -> None:
    gate = window_gate(win, TOL)
    assert gate["state"] == state
    assert any(words in reason for reason in gate["reasons"]), gate["reasons"]


def test_the_not_slower_margin_is_the_p99_tolerance() -> None:
    win = window(p99=(0.9, 1.08), median=(0.97, 1.03))
    assert window_gate(win, 0.05)["state"] == "wait"
    assert window_gate(win, 0.10)["state"] == "pass"


def test_an_empty_arm_or_a_missing_metric_waits() -> None:
    empty = cast(
        WindowComparison,
        {"metrics": {"e2e": {"n": {"baseline": 12, "speculative": 0}, "sequential": None}}},
    )
    gate = window_gate(empty, TOL)
    assert gate == {
        "state": "wait",
        "reasons": ["an arm has no E2E samples in this window (baseline 12, speculative 0)"],
    }
    assert window_gate(cast(WindowComparison, {"metrics": {}}), TOL)["state"] == "wait"
