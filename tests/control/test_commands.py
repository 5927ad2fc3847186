"""Admin API bodies -> arm events, and the arms view: every bad input named, the view's sums."""

from __future__ import annotations

import math
from typing import Any

import pytest

from specproxy.control.commands import (
    CommandError,
    UnknownArm,
    arm_event,
    arms_view,
    experiment_event,
)
from specproxy.control.events import ALL_ARMS, MAX_REASON_CHARS, ArmEvent, ArmState


def _arm(doc: object, name: str = "speculative") -> ArmEvent:
    return arm_event(
        doc,
        name=name,
        treatments=("speculative",),
        control="baseline",
        run_id="run",
        t=5.0,
        who="alice",
    )


def test_valid_bodies_become_events() -> None:
    assert _arm({"action": "set", "weight": 0.25, "why": "ramp"}) == ArmEvent(
        "run", 5.0, "set", "speculative", 0.25, "alice", "ramp"
    )
    assert _arm({"action": "set", "weight": 1}).weight == 1.0
    assert _arm({"action": "pause"}).action == "pause"
    assert _arm({"action": "resume", "why": ""}).why == ""
    stop = experiment_event({"action": "stop", "why": "p99"}, run_id="run", t=1.0, who="admin")
    assert (stop.action, stop.arm, stop.why) == ("stop", ALL_ARMS, "p99")


@pytest.mark.parametrize(
    ("doc", "param"),
    [
        ([], None),
        ("set", None),
        ({"action": "stop"}, "action"),
        ({"action": "SET", "weight": 0.5}, "action"),
        ({"action": "set"}, "weight"),
        ({"action": "set", "weight": 1.5}, "weight"),
        ({"action": "set", "weight": -0.1}, "weight"),
        ({"action": "set", "weight": math.nan}, "weight"),
        ({"action": "set", "weight": True}, "weight"),
        ({"action": "set", "weight": "0.5"}, "weight"),
        ({"action": "pause", "weight": 0.5}, "weight"),
        ({"action": "pause", "why": "x" * (MAX_REASON_CHARS + 1)}, "why"),
        ({"action": "pause", "why": "line\nbreak"}, "why"),
        ({"action": "pause", "why": 3}, "why"),
        ({"action": "pause", "bogus": 1}, "bogus"),
    ],
)
def test_bad_arm_bodies_name_the_field(doc: Any, param: str | None) -> None:
    with pytest.raises(CommandError) as info:
        _arm(doc)
    assert info.value.param == param
    assert not isinstance(info.value, UnknownArm)


def test_unknown_arms_and_the_control_arm_are_not_found() -> None:
    with pytest.raises(UnknownArm, match="control arm"):
        _arm({"action": "set", "weight": 0.5}, name="baseline")
    with pytest.raises(UnknownArm, match="no treatment arm"):
        _arm({"action": "pause"}, name="x" * 1000)
    with pytest.raises(CommandError, match="action"):
        experiment_event({"action": "pause"}, run_id="run", t=1.0, who="admin")


def test_the_view_gives_the_control_arm_the_rest() -> None:
    events = [
        ArmEvent("run", 1.0, "set", "speculative", 0.3, id=1),
        ArmEvent("run", 2.0, "pause", "speculative", id=2),
    ]
    state = ArmState({"speculative": 0.5}).fold(events)
    view = arms_view(
        state,
        configured={"speculative": 0.5},
        control="baseline",
        recent=reversed(events),
        run_id="run",
        poll_s=2.0,
    )
    treatment, control = view["arms"]
    assert treatment == {
        "name": "speculative",
        "role": "treatment",
        "configured_weight": 0.5,
        "weight": 0.3,
        "share": 0.0,
        "paused": True,
        "stopped": False,
    }
    assert control["role"] == "control" and control["share"] == 1.0
    assert control["configured_weight"] == 0.5 and control["weight"] is None
    assert [e["id"] for e in view["events"]] == [1, 2]  # oldest first
    assert view["last_event_id"] == 2 and not view["stopped"]
