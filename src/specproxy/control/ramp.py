"""The guarded ramp's decision: one treatment arm's next step, hold, or cut, as values (no I/O).

A treatment arm on the ramp steps through `RampConfig.schedule` (e.g. 1% -> 5% -> 25% -> 50%).
After each stats tick the leader asks `decide` about each ramped arm with:

- where the arm stands, folded from the arm events (`RampPosition.of`): its current weight, the
  event that set it (id, time, who), and whether the experiment or the arm is paused/stopped;
- the guards of this tick (`guards`), read off the same stats result the verdicts are: the E2E
  metric's anytime-valid P99 test says slower, its median verdict says slower, or the error-rate
  e-process (`stats.anytime.errorrate`) says the treatment errs more than the control;
- the treatment's usable requests since its step began;
- how far the guards' reading of the step lags behind (a new leader replays the step's requests
  a bounded span per tick, `stats.job.ramp`).

Any failing guard while the arm has traffic: `cut` (weight 0, at once; evidence read so far
suffices). No guard failing, at a step of the schedule, with `min_samples` and `min_minutes` at
it, and the guards' reading caught up: `step` to the next weight. Otherwise `hold`, with the
reason. A cut is final: the ramp never raises an arm it cut, nor one
a person set off the schedule (a person resumes by setting a weight on it). The first step is
the guard's `start` (the arm set to schedule[0]) while no event about the arm exists yet,
whatever its configured weight.

Acting once: a decision carries the id of the event it was based on (`basis`). The leader
writes it only if the arm's newest event is still that one (`Decision.still_valid`), re-read
from the store just before the write, so a decision replayed by a new leader, or one a person
overtook, is dropped; replicas apply the written event within one control poll.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from specproxy.config import RampConfig
from specproxy.control.events import ALL_ARMS, ArmEvent
from specproxy.stats.anytime.errorrate import ErrorRateTest
from specproxy.stats.result import Sequential

__all__ = [
    "GUARD",
    "Decision",
    "Move",
    "RampPosition",
    "decide",
    "guard_event",
    "guarded",
    "guards",
    "step_index",
]

GUARD: Final = "guard"  # the `who` of every event the ramp writes
Move = Literal["start", "step", "cut", "hold"]
_EPS: Final = 1e-9


@dataclass(frozen=True, slots=True)
class RampPosition:
    """Where one treatment arm stands: its weight, the event that set it (0 / None: configured,
    no event yet), whether that was the guard, and whether it gets traffic now."""

    arm: str
    weight: float
    basis: int = 0  # id of the newest event about this arm (0: none)
    since: float | None = None  # time of the event that set the weight (None: the run's start)
    by_guard: bool = False
    live: bool = True  # not paused, experiment not stopped

    @classmethod
    def of(
        cls, arm: str, configured: float, events: Iterable[ArmEvent], run_start: float
    ) -> RampPosition:
        """Fold the run's events (any order) for `arm`."""
        weight, basis, since, by_guard = configured, 0, run_start, False
        paused = stopped = False
        for ev in sorted(events, key=lambda e: e.id):
            if ev.arm == ALL_ARMS:
                stopped = ev.action == "stop"
                continue
            if ev.arm != arm:
                continue
            basis = ev.id
            if ev.action == "set":
                assert ev.weight is not None
                weight, since, by_guard = ev.weight, ev.t, ev.who == GUARD
            else:
                paused = ev.action == "pause"
        return cls(arm, weight, basis, since, by_guard, not (paused or stopped))


@dataclass(frozen=True, slots=True)
class Decision:
    """What the ramp does about one arm now: `weight` is the weight it sets (None: hold)."""

    arm: str
    move: Move
    weight: float | None
    why: str
    basis: int
    step: int | None  # index in the schedule after the move (None: off the schedule / cut)

    def still_valid(self, newest_id: int) -> bool:
        """Whether the arm's newest stored event is still the one this decision read."""
        return newest_id == self.basis


def step_index(schedule: Sequence[float], weight: float) -> int | None:
    """The 0-based step of the schedule at `weight` (None: off it)."""
    for i, w in enumerate(schedule):
        if abs(w - weight) <= _EPS:
            return i
    return None


def guarded(position: RampPosition) -> bool:
    """Whether the guards can change the arm's move: only an arm with a weight can be cut, so
    for one at 0 (cut, or set to 0 by a person) the ramp reads no requests at all."""
    return position.weight > 0.0


def decide(
    policy: RampConfig,
    position: RampPosition,
    *,
    now: float,
    guards: Sequence[str],
    samples: int,
    behind_s: float = 0.0,
) -> Decision:
    """The ramp's move for one arm; `guards`: the failing guards' reasons (empty: none fails);
    `samples`: the treatment's usable requests since `position.since` read so far; `behind_s`:
    how far behind now the guards have read them (> 0: no step up until they have caught up)."""
    arm, weight, schedule = position.arm, position.weight, policy.schedule
    at = step_index(schedule, weight)

    def hold(why: str) -> Decision:
        return Decision(arm, "hold", None, why, position.basis, at)

    if guards and weight > 0.0:
        why = "cut: " + "; ".join(guards)
        return Decision(arm, "cut", 0.0, why, position.basis, None)
    if not position.live:
        return hold("paused or stopped: the ramp waits")
    if weight <= 0.0 and position.by_guard:
        return hold("cut by the guard: a person restarts the ramp by setting a weight")
    if position.basis == 0:  # no event about the arm yet: its configured weight is no step
        why = f"start: weight {schedule[0]:g} (the ramp's first step)"
        return Decision(arm, "start", schedule[0], why, position.basis, 0)
    if at is None:
        return hold(f"weight {weight:g} was set off the schedule: the ramp holds")
    if at == len(schedule) - 1:
        return hold(f"at the final step ({weight:g})")
    if behind_s > 0.0:
        return hold(f"step {at + 1}/{len(schedule)}: the guards catch up ({behind_s:.0f} s behind)")
    minutes = (now - (position.since if position.since is not None else now)) / 60.0
    if samples < policy.min_samples or minutes < policy.min_minutes:
        return hold(
            f"step {at + 1}/{len(schedule)} ({weight:g}): {samples}/{policy.min_samples} "
            f"requests, {minutes:.1f}/{policy.min_minutes:g} minutes"
        )
    nxt = schedule[at + 1]
    why = (
        f"step {at + 2}/{len(schedule)}: {weight:g} -> {nxt:g} after {samples} requests and "
        f"{minutes:.1f} minutes, no guard failing"
    )
    return Decision(arm, "step", nxt, why, position.basis, at + 1)


def guard_event(decision: Decision, *, run_id: str, t: float) -> ArmEvent | None:
    """The arm event a decision writes (None for a hold), who = "guard"."""
    if decision.weight is None:
        return None
    return ArmEvent(run_id, t, "set", decision.arm, decision.weight, GUARD, decision.why[:256])


def guards(seq: Sequential | None, errors: ErrorRateTest | None) -> list[str]:
    """The failing guards of one tick, as reasons (empty: none fails): `seq` the E2E metric's
    `sequential` block (the verdicts' anytime-valid evidence, held across ticks: a window's, or
    the current step's from `stats.rampguard.StepGuard`), `errors` the error-rate e-process."""
    failing: list[str] = []
    if seq is not None:
        if seq["p99_slower"]:
            failing.append(
                f"E2E P99 slower (anytime-valid; ratio lower bound {_fmt(seq['p99_ratio_lower'])})"
            )
        if seq["median_slower"]:
            failing.append(
                f"E2E median slower (ratio lower bound {_fmt(seq['median_ratio_lower'])})"
            )
    if errors is not None and errors.rejected:
        failing.append(
            f"error rate higher than the control's ({_fmt(errors.treatment_rate)} vs "
            f"{_fmt(errors.control_rate)}, e-value >= 1/alpha)"
        )
    return failing


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3g}"
