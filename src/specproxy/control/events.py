"""Arm-control events and the state they fold into: pure values, no I/O.

An event changes one arm, or the whole experiment:

    set     NAME weight W   the treatment arm NAME gets share W of the traffic (0 <= W <= 1)
    pause   NAME            NAME gets no traffic until resumed (its weight is kept)
    resume  NAME            NAME gets its weight again
    stop    *               every request goes to the control arm (the kill switch)
    start   *               the experiment runs again with the arms' weights

A treatment arm's weight is its share of the traffic, as Flagger's and Argo Rollouts' `setWeight`
is; the control arm serves the rest, so it has no weight of its own to set. `who` is the name
the caller gave (the admin token is one shared secret, so it is a claim, not an identity: the
Basic user name, else "admin"), or "guard" for the guarded ramp; `why` is free text, bounded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal, get_args

__all__ = [
    "ALL_ARMS",
    "MAX_REASON_CHARS",
    "MAX_WHO_CHARS",
    "Action",
    "ArmEvent",
    "ArmState",
]

Action = Literal["set", "pause", "resume", "stop", "start"]
ALL_ARMS: Final = "*"  # the arm of `stop` and `start`
MAX_WHO_CHARS: Final = 64
MAX_REASON_CHARS: Final = 256


@dataclass(frozen=True, slots=True)
class ArmEvent:
    """One change of the experiment's routing, as stored (`id` is the store's, 0 before)."""

    run_id: str
    t: float  # unix seconds
    action: Action
    arm: str  # a treatment arm's name, or ALL_ARMS for stop/start
    weight: float | None = None  # with `set` only
    who: str = "admin"
    why: str = ""
    id: int = 0

    def __post_init__(self) -> None:
        if self.action not in get_args(Action):
            raise ValueError(f"unknown action {self.action!r}")
        if self.action == "set":
            if self.weight is None or not 0.0 <= self.weight <= 1.0:
                raise ValueError("set needs a weight in [0, 1]")
        elif self.weight is not None:
            raise ValueError(f"{self.action} takes no weight")
        if (self.arm == ALL_ARMS) != (self.action in ("stop", "start")):
            raise ValueError(f"{self.action} does not apply to arm {self.arm!r}")
        if not self.who or len(self.who) > MAX_WHO_CHARS or not self.who.isprintable():
            raise ValueError(f"who must be 1-{MAX_WHO_CHARS} printable characters")
        if len(self.why) > MAX_REASON_CHARS or not self.why.isprintable():
            raise ValueError(f"why must be at most {MAX_REASON_CHARS} printable characters")


@dataclass(frozen=True, slots=True)
class ArmState:
    """What a replica applies: each treatment's configured or last set weight, the paused arms,
    and whether the experiment is stopped; `last_id` is the newest event folded in."""

    weights: Mapping[str, float]
    paused: frozenset[str] = frozenset()
    stopped: bool = False
    last_id: int = 0

    def share(self, arm: str) -> float:
        """The share of the traffic `arm` gets now (0 when paused or stopped)."""
        if self.stopped or arm in self.paused:
            return 0.0
        return self.weights.get(arm, 0.0)

    def fold(self, events: Iterable[ArmEvent]) -> ArmState:
        """This state with `events` applied in order (events for unknown arms are ignored)."""
        weights = dict(self.weights)
        paused = set(self.paused)
        stopped = self.stopped
        last = self.last_id
        for ev in events:
            last = max(last, ev.id)
            if ev.action == "stop":
                stopped = True
            elif ev.action == "start":
                stopped = False
            elif ev.arm not in weights:
                continue
            elif ev.action == "set":
                assert ev.weight is not None
                weights[ev.arm] = ev.weight
            elif ev.action == "pause":
                paused.add(ev.arm)
            else:  # resume
                paused.discard(ev.arm)
        return ArmState(weights, frozenset(paused), stopped, last)
