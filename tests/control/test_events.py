"""Arm events and their fold: validation of each event, and the state a sequence leaves."""

from __future__ import annotations

import pytest

from specproxy.control.events import ALL_ARMS, MAX_REASON_CHARS, MAX_WHO_CHARS, ArmEvent, ArmState


@pytest.mark.parametrize(
    "kwargs",
    [
        {"action": "set", "arm": "speculative"},
        {"action": "set", "arm": "speculative", "weight": 1.01},
        {"action": "pause", "arm": "speculative", "weight": 0.5},
        {"action": "stop", "arm": "speculative"},
        {"action": "pause", "arm": ALL_ARMS},
        {"action": "jump", "arm": "speculative"},
        {"action": "pause", "arm": "speculative", "who": ""},
        {"action": "pause", "arm": "speculative", "who": "x" * (MAX_WHO_CHARS + 1)},
        {"action": "pause", "arm": "speculative", "why": "x" * (MAX_REASON_CHARS + 1)},
        {"action": "pause", "arm": "speculative", "why": "a\nb"},
    ],
)
def test_invalid_events_are_refused(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        ArmEvent(run_id="run", t=1.0, **kwargs)  # type: ignore[arg-type]


def test_the_fold_keeps_weights_through_pauses_and_stops() -> None:
    start = ArmState({"speculative": 0.5})
    events = [
        ArmEvent("run", 1.0, "set", "speculative", 0.2, id=1),
        ArmEvent("run", 2.0, "pause", "speculative", id=2),
        ArmEvent("run", 3.0, "set", "speculative", 0.4, id=3),  # set while paused: kept
        ArmEvent("run", 4.0, "set", "unknown-arm", 0.9, id=4),  # ignored
        ArmEvent("run", 5.0, "stop", ALL_ARMS, id=5),
        ArmEvent("run", 6.0, "resume", "speculative", id=6),
    ]
    state = start.fold(events)
    assert state.weights == {"speculative": 0.4} and state.last_id == 6
    assert state.stopped and state.share("speculative") == 0.0
    started = state.fold([ArmEvent("run", 7.0, "start", ALL_ARMS, id=7)])
    assert started.share("speculative") == 0.4 and not started.stopped
    assert start.share("speculative") == 0.5  # folding never changes the state folded from
