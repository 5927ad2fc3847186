"""The guarded ramp's place in the stats process: each interval, just before its tick, the leader
decides each ramped arm's move (`control.ramp.decide`) and writes it as an arm event (who =
"guard").

Why here: the stats process already reads the run's records, is the one leader of the run
(`stats.job.leader`), and the proxy process must stay free of numpy. Per ramped treatment arm,
each tick: fold the run's arm events into its `RampPosition`; read both arms' requests of its
step (since the event that set its weight: one time block of one share) that ended since the
last read, and fold them into the step's guards (`stats.rampguard.StepGuard`: the latency guard
and the error-rate e-process, each at alpha / 2 split over the schedule's steps, so the ramp's
false-cut probability over a run stays <= the stats alpha); decide; re-read the arm's events and
write the event only if the newest is still the one the decision read (`Decision.still_valid`),
so a leader change or a person's change in between drops it instead of acting twice. Replicas
apply the event within one `[control] poll_s`. `dry_run`: log and count the move, write nothing.

Bounded per tick. A row is written when its request ends, so the requests that ended in
[last read, now - `landing_s`) are the ones that landed since the last read (`landing_s`: the
store's flush and the replicas' clock skew, `stats.future_skew_s` + `LANDING_S`); the store
finds them by an index on the end (`read_records(ended_since=...)`), however long the step has
lasted, and the guards keep what they need of earlier ones (`stats.rampguard`). A leader that
takes over mid-step (or a process restart) replays the step from its start, at most
`CATCH_UP_S` of request ends per tick; meanwhile a failing guard still cuts (the evidence read
so far is valid evidence), and the ramp holds instead of stepping up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Final, Protocol

import numpy as np

from specproxy.config import RampConfig, StatsConfig
from specproxy.control.events import ArmEvent
from specproxy.control.ramp import (
    Decision,
    RampPosition,
    decide,
    guard_event,
    guarded,
    guards,
    step_index,
)
from specproxy.errors import ErrorKind
from specproxy.records import SHORTHAND_CONTROL, Arm
from specproxy.stats.job.horizon import DEFAULT_HORIZON_S, HORIZON_MAX_S, horizon_s
from specproxy.stats.rampguard import UNIT_S, StepGuard, StepLook, StepRows
from specproxy.stats.result import RampStatus

__all__ = [
    "CATCH_UP_S",
    "COLUMNS",
    "DEFAULT_HORIZON_S",
    "HORIZON_MAX_S",
    "LANDING_S",
    "RampJob",
    "RampStore",
    "horizon_s",
    "step_rows",
]

log = logging.getLogger(__name__)

COLUMNS = ("t_start", "e2e_s", "status", "error_kind", "disconnected", "rerouted_from", "shadow")
Row = tuple[Any, ...]  # store.contract.Row
LANDING_S: Final = 5.0  # a row is in the store this long after its request ended (flush <= 1 s)
CATCH_UP_S: Final = 300.0  # request ends a tick reads while it replays a step (a new leader)


class RampStore(Protocol):
    """What the ramp reads and writes (`store.contract`: SummaryReader.read_records, Control)."""

    async def read_records(
        self,
        *,
        run_id: str,
        columns: Sequence[str],
        since: float | None = None,
        until: float | None = None,
        usable_only: bool = False,
        ended_since: float | None = None,
        ended_until: float | None = None,
    ) -> dict[Arm, list[Row]]: ...

    async def add_arm_event(self, event: ArmEvent) -> ArmEvent: ...

    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]: ...


def _errored(row: Row) -> bool:
    status, kind = row[2], row[3]
    if kind is not None:
        return not ErrorKind(kind).verdict_free
    return int(status) >= 500


def step_rows(rows: Sequence[Row], *, since: float) -> StepRows:
    """One arm's `COLUMNS` rows as the guards read them: the primary requests (not shadow, not
    rerouted, client connected) started at or after `since`, each with its minute of the step,
    whether it errored, and whether its E2E is usable (not errored, HTTP 200, E2E > 0)."""
    primary = [r for r in rows if not r[6] and r[5] is None and not r[4] and r[0] >= since]
    t = np.array([float(r[0]) for r in primary], dtype=np.float64)
    e2e = np.array([float(r[1]) for r in primary], dtype=np.float64)
    bad = np.array([_errored(r) for r in primary], dtype=bool)
    ok = ~bad & np.array([r[2] == 200 for r in primary], dtype=bool) & (e2e > 0)
    unit = np.floor_divide(t - since, UNIT_S).astype(np.int64)
    return StepRows.of(unit, e2e, usable=ok, errored=bad)


class RampJob:
    """The ramp of the run's treatment arms (`configured`: each ramped arm's configured weight;
    `treatments` the store's arms by name), run by the leader each interval before its tick
    (`move`). `horizon_s`: how long after its minute a request may still land (`horizon_s`)."""

    def __init__(
        self,
        store: RampStore,
        *,
        run_id: str,
        policy: RampConfig,
        stats_cfg: StatsConfig,
        configured: Mapping[str, float],
        run_start: float,
        control: str = SHORTHAND_CONTROL,
        clock: Callable[[], float],
        executor: Executor | None = None,
        horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._policy = policy
        self._configured = dict(configured)
        self._control = control
        self._run_start = run_start
        self._clock = clock
        self._executor = executor
        self._landing_s = stats_cfg.future_skew_s + LANDING_S
        self._guards = {
            arm: StepGuard(
                alpha=stats_cfg.alpha / 2.0,  # each guard's share: latency, error rate
                tolerance=stats_cfg.p99_tolerance,
                steps=len(policy.schedule),
                revise_s=horizon_s,
            )
            for arm in configured
        }
        self._looks: dict[str, tuple[float, int]] = {}  # arm -> (seconds behind, late requests)
        self.last: dict[str, Decision] = {}
        self._steps: dict[str, int] = {}  # each arm's 1-based step after its last move
        self._moves: dict[str, dict[str, int]] = {arm: {} for arm in configured}

    def status(self) -> dict[str, RampStatus]:
        """Each ramped arm that has been decided on: its step and this job's moves, which the
        stats collector exports (`specproxy_ramp_step`, `specproxy_ramp_decisions_total`)."""
        out: dict[str, RampStatus] = {}
        for arm, step in self._steps.items():
            status = RampStatus(
                step=step, moves=dict(self._moves[arm]), dry_run=self._policy.dry_run
            )
            if arm in self.last:
                status["last_move"] = self.last[arm].move
                status["last_why"] = self.last[arm].why
            if arm in self._looks:
                status["behind_s"], status["late"] = self._looks[arm]
            out[arm] = status
        return out

    async def move(self) -> list[Decision]:
        """Decide (and unless dry_run, apply) each ramped arm's move now."""
        out = []
        for arm in self._configured:
            decision = await self._decide(arm)
            if decision is not None:
                out.append(decision)
        return out

    async def _decide(self, arm: str) -> Decision | None:
        events = await self._store.arm_events(run_id=self._run_id)
        pos = RampPosition.of(arm, self._configured[arm], events, self._run_start)
        if not guarded(pos):  # e.g. cut: it holds for the rest of the run, reading nothing
            decision = decide(self._policy, pos, now=self._clock(), guards=[], samples=0)
            self.last[arm] = decision
            await self._apply(decision, pos)
            return decision
        since = pos.since if pos.since is not None else self._run_start
        guard = self._guards[arm]
        guard.begin(since=since, basis=pos.basis)
        landed = self._clock() - self._landing_s
        start = guard.read_until
        until = max(start, min(landed, start + CATCH_UP_S))
        rows = await self._store.read_records(
            run_id=self._run_id, columns=COLUMNS, ended_since=start, ended_until=until
        )
        if arm not in rows or self._control not in rows:
            log.warning("ramp: no arm named %s or no control in the store's rows", arm)
            return None
        now = self._clock()
        loop = asyncio.get_running_loop()
        look = await loop.run_in_executor(
            self._executor, self._fold, guard, rows[self._control], rows[arm], since, until, now
        )
        behind = max(0.0, landed - until)
        self._looks[arm] = (behind, look.late)
        failing = guards(look.seq, look.errors)
        decision = decide(
            self._policy, pos, now=now, guards=failing, samples=look.samples, behind_s=behind
        )
        self.last[arm] = decision
        await self._apply(decision, pos)
        return decision

    @staticmethod
    def _fold(
        guard: StepGuard,
        control: list[Row],
        treatment: list[Row],
        since: float,
        until: float,
        now: float,
    ) -> StepLook:
        c, t = (step_rows(rows, since=since) for rows in (control, treatment))
        guard.fold(c, t, until=until)
        return guard.look(at=now)

    async def _apply(self, decision: Decision, pos: RampPosition) -> None:
        dry = self._policy.dry_run
        event = guard_event(decision, run_id=self._run_id, t=self._clock())
        if event is None or dry:
            self._set_step(decision.arm, step_index(self._policy.schedule, pos.weight))
        if event is None:
            return
        if dry:
            log.warning(
                "ramp (dry run): would %s %s: %s", decision.move, decision.arm, decision.why
            )
        else:
            newest = RampPosition.of(
                decision.arm,
                self._configured[decision.arm],
                await self._store.arm_events(run_id=self._run_id),
                self._run_start,
            )
            if not decision.still_valid(newest.basis):
                log.info("ramp: %s's events changed since the decision; dropped", decision.arm)
                return
            stored = await self._store.add_arm_event(event)
            self._set_step(decision.arm, decision.step)
            log.warning(
                "ramp: %s %s (event %d): %s", decision.move, decision.arm, stored.id, decision.why
            )
        moves = self._moves[decision.arm]
        moves[decision.move] = moves.get(decision.move, 0) + 1

    def _set_step(self, arm: str, step: int | None) -> None:
        self._steps[arm] = 0 if step is None else step + 1
