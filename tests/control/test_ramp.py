"""The guarded ramp's decision: start, step, hold, cut; folded from the arm events; acts once."""

from __future__ import annotations

from specproxy.config import RampConfig
from specproxy.control.events import ArmEvent
from specproxy.control.ramp import GUARD, RampPosition, decide, guard_event, guards
from specproxy.stats.anytime.errorrate import ErrorRateTest
from specproxy.stats.result import Sequential

POLICY = RampConfig(enabled=True, schedule=(0.01, 0.05, 0.5), min_samples=100, min_minutes=5)


def _at(
    weight: float, *, since: float = 0.0, basis: int = 1, by_guard: bool = True
) -> RampPosition:
    return RampPosition("spec", weight, basis, since, by_guard)


def test_an_arm_no_guard_set_yet_starts_at_the_first_step() -> None:
    d = decide(POLICY, RampPosition("spec", 0.3), now=0.0, guards=[], samples=0)
    assert (d.move, d.weight, d.step) == ("start", 0.01, 0)
    event = guard_event(d, run_id="r", t=1.0)
    assert event is not None and event.who == GUARD and event.weight == 0.01
    assert event.why.startswith("start")
    # a configured weight that happens to be a step is no step the ramp took
    assert decide(POLICY, RampPosition("spec", 0.5), now=0.0, guards=[], samples=0).move == "start"


def test_it_steps_only_with_enough_samples_and_minutes() -> None:
    assert decide(POLICY, _at(0.01), now=299.0, guards=[], samples=500).move == "hold"
    held = decide(POLICY, _at(0.01), now=600.0, guards=[], samples=99)
    assert held.move == "hold" and "99/100 requests" in held.why
    assert guard_event(held, run_id="r", t=1.0) is None
    d = decide(POLICY, _at(0.01), now=300.0, guards=[], samples=100)
    assert (d.move, d.weight, d.step) == ("step", 0.05, 1)


def test_the_final_step_holds() -> None:
    d = decide(POLICY, _at(0.5), now=1e6, guards=[], samples=10**6)
    assert d.move == "hold" and "final" in d.why


def test_any_failing_guard_cuts_at_once_and_a_cut_is_final() -> None:
    d = decide(POLICY, _at(0.05, since=100.0), now=101.0, guards=["E2E P99 slower"], samples=1)
    assert (d.move, d.weight) == ("cut", 0.0)
    assert d.why == "cut: E2E P99 slower"
    after = decide(POLICY, _at(0.0), now=1e6, guards=[], samples=10**6)
    assert after.move == "hold" and "cut by the guard" in after.why
    # a weight a person set off the schedule is held, and still cut on a failing guard
    manual = _at(0.2, by_guard=False)
    assert decide(POLICY, manual, now=1e6, guards=[], samples=10**6).move == "hold"
    assert decide(POLICY, manual, now=1e6, guards=["x"], samples=0).move == "cut"


def test_paused_or_stopped_arms_wait() -> None:
    pos = RampPosition.of(
        "spec",
        0.0,
        [
            ArmEvent("r", 10.0, "set", "spec", 0.01, GUARD, "start", id=1),
            ArmEvent("r", 20.0, "stop", "*", who="admin", id=2),
        ],
        run_start=0.0,
    )
    assert not pos.live and pos.weight == 0.01 and pos.since == 10.0 and pos.by_guard
    assert decide(POLICY, pos, now=1e6, guards=[], samples=10**6).move == "hold"


def test_the_position_folds_the_newest_events_of_the_arm() -> None:
    events = [
        ArmEvent("r", 30.0, "set", "spec", 0.2, "alice", "", id=3),
        ArmEvent("r", 10.0, "set", "spec", 0.01, GUARD, "start", id=1),
        ArmEvent("r", 20.0, "set", "other", 0.05, GUARD, "start", id=2),
    ]
    pos = RampPosition.of("spec", 0.0, events, run_start=0.0)
    assert (pos.weight, pos.basis, pos.since, pos.by_guard, pos.live) == (0.2, 3, 30.0, False, True)
    assert RampPosition.of("spec", 0.1, [], run_start=5.0) == RampPosition("spec", 0.1, 0, 5.0)


def test_a_decision_is_written_only_while_its_basis_is_the_newest_event() -> None:
    d = decide(POLICY, _at(0.01, basis=7), now=1e6, guards=[], samples=10**6)
    assert d.still_valid(7)
    assert not d.still_valid(8)  # another leader or a person wrote since: drop it


def _seq(**flags: bool) -> Sequential:
    base = {
        "p99_ratio_lower": 1.21,
        "p99_ratio_upper": 1.5,
        "median_ratio_lower": 1.02,
        "median_ratio_upper": 1.1,
        "p99_slower": False,
        "median_slower": False,
        "median_faster": False,
    }
    return base | flags  # type: ignore[return-value]


def test_guards_read_the_verdicts_evidence_and_the_error_test() -> None:
    assert guards(None, None) == []
    assert guards(_seq(), None) == []
    assert guards(_seq(p99_slower=True, median_slower=True), None) == [
        "E2E P99 slower (anytime-valid; ratio lower bound 1.21)",
        "E2E median slower (ratio lower bound 1.02)",
    ]
    err = ErrorRateTest(3.5, 3.0, True, 0.01, 0.03)
    assert guards(None, err) == [
        "error rate higher than the control's (0.03 vs 0.01, e-value >= 1/alpha)"
    ]
    assert guards(None, ErrorRateTest(1.0, 3.0, False, 0.01, 0.011)) == []
