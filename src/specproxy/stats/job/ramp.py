"""The guarded ramp's place in the stats process: each interval, just before its tick, the leader
decides each ramped arm's move (`control.ramp.decide`) and writes it as an arm event (who =
"guard").

Why here: the stats process already reads the run's records, is the one leader of the run
(`stats.job.leader`), and the proxy process must stay free of numpy. Per ramped treatment arm,
each tick: fold the run's arm events into its `RampPosition`; read the requests of both arms
since its step began (one time block of one share: `stats.rampguard`); run the step's latency
guard and the error-rate e-process on them, each at alpha / 2 and split over the schedule's
steps (the ramp's false-cut probability over a run stays <= the stats alpha); decide; re-read
the arm's events and write the event only if the newest is still the one the decision read
(`Decision.still_valid`), so a leader change or a person's change in between drops it instead
of acting twice. Replicas apply the event within one `[control] poll_s`. `dry_run`: log and
count the move, write nothing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from typing import Any, Protocol

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
from specproxy.stats.anytime.errorrate import UnitErrors, error_rate_test
from specproxy.stats.rampguard import StepGuard
from specproxy.stats.result import RampStatus, Sequential
from specproxy.stats.sample import ArmSample

__all__ = ["COLUMNS", "RampJob", "RampStore", "step_inputs"]

log = logging.getLogger(__name__)

COLUMNS = ("t_start", "e2e_s", "status", "error_kind", "disconnected", "rerouted_from", "shadow")
Row = tuple[Any, ...]  # store.contract.Row


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
    ) -> dict[Arm, list[Row]]: ...

    async def add_arm_event(self, event: ArmEvent) -> ArmEvent: ...

    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]: ...


def _errored(row: Row) -> bool:
    status, kind = row[2], row[3]
    if kind is not None:
        return not ErrorKind(kind).verdict_free
    return int(status) >= 500


def step_inputs(
    control: Sequence[Row], treatment: Sequence[Row], *, since: float, unit_s: float = 60.0
) -> tuple[ArmSample, ArmSample, list[UnitErrors]]:
    """Both arms' E2E samples of the step (usable primary requests) and its per-unit error
    counts (primary requests the client did not leave, rerouted ones excluded), from `COLUMNS`
    rows with t_start >= `since`."""
    arms = []
    counts = []
    for rows in (control, treatment):
        primary = [r for r in rows if not r[6] and r[5] is None and not r[4]]
        unit = np.array([int((r[0] - since) // unit_s) for r in primary], dtype=np.int64)
        bad = np.array([_errored(r) for r in primary], dtype=bool)
        e2e = np.array([float(r[1]) for r in primary], dtype=np.float64)
        ok = (~bad) & (np.array([r[2] == 200 for r in primary], dtype=bool)) & (e2e > 0)
        arms.append((unit, bad, e2e, ok))
    units = 1 + max((int(a[0].max()) for a in arms if a[0].size), default=0)
    samples = [ArmSample.from_values(e2e[ok], unit[ok], units, unit_s) for unit, _, e2e, ok in arms]
    for unit, bad, _e2e, _ok in arms:
        counts.append(
            (
                np.bincount(unit, minlength=units),
                np.bincount(unit, weights=bad.astype(np.float64), minlength=units),
            )
        )
    errors = [
        UnitErrors(
            int(counts[0][0][u]), int(counts[0][1][u]), int(counts[1][0][u]), int(counts[1][1][u])
        )
        for u in range(units)
    ]
    return samples[0], samples[1], errors


class RampJob:
    """The ramp of the run's treatment arms (`configured`: each ramped arm's configured weight;
    `treatments` the store's arms by name), run by the leader each interval before its tick
    (`move`)."""

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
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._policy = policy
        self._configured = dict(configured)
        self._control = control
        self._run_start = run_start
        self._clock = clock
        self._executor = executor
        level = stats_cfg.alpha / 2.0
        steps = len(policy.schedule)
        self._alpha_errors = level / steps
        self._guards = {
            arm: StepGuard(alpha=level, tolerance=stats_cfg.p99_tolerance, steps=steps)
            for arm in configured
        }
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
        rows = await self._store.read_records(run_id=self._run_id, columns=COLUMNS, since=since)
        by_name = dict(rows)
        controls = [rows[self._control]] if self._control in rows else []
        if arm not in by_name or not controls:
            log.warning("ramp: no arm named %s or no control in the store's rows", arm)
            return None
        now = self._clock()
        loop = asyncio.get_running_loop()
        seq, errors_test, samples = await loop.run_in_executor(
            self._executor, self._evaluate, arm, controls[0], by_name[arm], since, pos.basis, now
        )
        decision = decide(
            self._policy, pos, now=now, guards=guards(seq, errors_test), samples=samples
        )
        self.last[arm] = decision
        await self._apply(decision, pos)
        return decision

    def _evaluate(
        self,
        arm: str,
        control: list[Row],
        treatment: list[Row],
        since: float,
        basis: int,
        now: float,
    ) -> tuple[Sequential | None, Any, int]:
        c, t, errors = step_inputs(control, treatment, since=since)
        seq = self._guards[arm].look(c, t, basis=basis, at=now)
        return seq, error_rate_test(errors, alpha=self._alpha_errors), t.n

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
