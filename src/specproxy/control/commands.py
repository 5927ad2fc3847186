"""The admin API's request bodies -> arm events, and the state -> GET /api/arms: pure, no I/O.

    POST /api/arms/{name}   {"action": "set", "weight": W, "why": "..."}   W in [0, 1]
                            {"action": "pause" | "resume", "why": "..."}
    POST /api/experiment    {"action": "stop" | "start", "why": "..."}

`why` is optional (at most `MAX_REASON_CHARS` printable characters). Anything else (another
key, a weight that is not a finite number, a weight with pause) is a `CommandError` with the
offending parameter, which the API answers with an OpenAI-style 400; a name that is no
treatment arm is an `UnknownArm` (404), the control arm included: it has no weight of its own,
it serves what the treatments do not get.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from specproxy.control.events import ALL_ARMS, MAX_REASON_CHARS, Action, ArmEvent, ArmState

__all__ = [
    "ARM_ACTIONS",
    "EXPERIMENT_ACTIONS",
    "CommandError",
    "UnknownArm",
    "arm_event",
    "arms_view",
    "event_doc",
    "experiment_event",
]

ARM_ACTIONS: Final[tuple[Action, ...]] = ("set", "pause", "resume")
EXPERIMENT_ACTIONS: Final[tuple[Action, ...]] = ("stop", "start")


class CommandError(ValueError):
    """A request body that is no valid command; `param` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class UnknownArm(CommandError):
    """The path names no treatment arm."""


def arm_event(
    doc: object,
    *,
    name: str,
    treatments: Iterable[str],
    control: str,
    run_id: str,
    t: float,
    who: str,
) -> ArmEvent:
    """The event of POST /api/arms/{name} with body `doc` (parsed JSON)."""
    treatments = tuple(treatments)
    if name not in treatments:
        hint = (
            f"{control} is the control arm: it gets what the treatments do not; set the weight "
            "of a treatment instead"
            if name == control
            else f"no treatment arm named {name[:64]!r}"
        )
        raise UnknownArm(f"{hint} (treatments: {', '.join(treatments)})", "name")
    body = _object(doc, allowed=("action", "weight", "why"))
    action = _action(body, ARM_ACTIONS)
    weight = body.get("weight")
    if action == "set":
        if weight is None:
            raise CommandError("set needs a weight in [0, 1]", "weight")
        weight = _weight(weight)
    elif weight is not None:
        raise CommandError(f"{action} takes no weight", "weight")
    return ArmEvent(run_id, t, action, name, weight, who, _why(body))


def experiment_event(doc: object, *, run_id: str, t: float, who: str) -> ArmEvent:
    """The event of POST /api/experiment with body `doc` (parsed JSON)."""
    body = _object(doc, allowed=("action", "why"))
    action = _action(body, EXPERIMENT_ACTIONS)
    return ArmEvent(run_id, t, action, ALL_ARMS, None, who, _why(body))


def _object(doc: object, *, allowed: tuple[str, ...]) -> Mapping[str, Any]:
    if not isinstance(doc, dict):
        raise CommandError("the body must be a JSON object")
    for key in doc:
        if key not in allowed:
            raise CommandError(
                f"unknown field {str(key)[:64]!r} (allowed: {', '.join(allowed)})", str(key)[:64]
            )
    return doc


def _action(body: Mapping[str, Any], actions: tuple[Action, ...]) -> Action:
    action = body.get("action")
    for known in actions:
        if action == known:
            return known
    raise CommandError(f"action must be one of {', '.join(actions)}", "action")


def _weight(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CommandError("weight must be a number in [0, 1]", "weight")
    weight = float(value)
    if not math.isfinite(weight) or not 0.0 <= weight <= 1.0:
        raise CommandError("weight must be a number in [0, 1]", "weight")
    return weight


def _why(body: Mapping[str, Any]) -> str:
    why = body.get("why", "")
    if not isinstance(why, str) or len(why) > MAX_REASON_CHARS or not why.isprintable():
        raise CommandError(
            f"why must be a string of at most {MAX_REASON_CHARS} printable characters", "why"
        )
    return why


def event_doc(event: ArmEvent) -> dict[str, Any]:
    """An event as JSON-able data."""
    return {
        "id": event.id,
        "t": event.t,
        "action": event.action,
        "arm": event.arm,
        "weight": event.weight,
        "who": event.who,
        "why": event.why,
    }


def arms_view(
    state: ArmState,
    *,
    configured: Mapping[str, float],
    control: str,
    recent: Iterable[ArmEvent],
    run_id: str,
    poll_s: float,
) -> dict[str, Any]:
    """GET /api/arms: each arm's role, configured weight, current share, paused and stopped,
    and the recent events (oldest first)."""
    arms: list[dict[str, Any]] = []
    for name, weight in configured.items():
        arms.append(
            {
                "name": name,
                "role": "treatment",
                "configured_weight": weight,
                "weight": state.weights.get(name, weight),
                "share": state.share(name),
                "paused": name in state.paused,
                "stopped": state.stopped,
            }
        )
    arms.append(
        {
            "name": control,
            "role": "control",
            "configured_weight": max(0.0, 1.0 - sum(configured.values())),
            "weight": None,  # the control arm has none: it serves the rest
            "share": max(0.0, 1.0 - sum(state.share(name) for name in configured)),
            "paused": False,
            "stopped": state.stopped,
        }
    )
    return {
        "run_id": run_id,
        "stopped": state.stopped,
        "last_event_id": state.last_id,
        "poll_s": poll_s,
        "arms": arms,
        "events": [event_doc(e) for e in sorted(recent, key=lambda e: e.id)],
    }
