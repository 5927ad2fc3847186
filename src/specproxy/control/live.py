"""One replica's live arm state: read the stored arm events, fold them, apply them to the router.

Every replica (each `serve` process, each of `--workers N`) holds one `ArmControl`. It starts
from the configured shares of the treatments (`Config.arm_shares`: `[arms.NAME] weight`, or the
shorthand's `[routing] speculative_share`) and, before the first request, folds every stored
event of the run, so a
restarted replica keeps a stop, a pause or a set weight. Then `control.context` calls `poll()`
every `[control] poll_s`: it reads the events after the newest one it folded and applies the new
state to the `Router` and to the gauges (`specproxy_arm_weight_ratio{arm}`,
`specproxy_experiment_stopped`). A change made through any replica is therefore applied by
every replica within one poll interval plus the store's write latency.

`submit(event)` is the admin API's path: the event is written to the store first (once, by this
replica only), then this replica reads and applies at once; the others do at their next poll.
A replica that cannot read the store keeps its last known state, logs the first failure of a
streak and counts every one (`specproxy_control_poll_failures_total`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Mapping
from typing import Final

from specproxy.control.events import ArmEvent, ArmState
from specproxy.metrics import ProxyMetrics
from specproxy.proxy.routing import Router
from specproxy.store.contract import Control

__all__ = ["RECENT_EVENTS", "ArmControl"]

log = logging.getLogger(__name__)

RECENT_EVENTS: Final = 20  # events GET /api/arms shows


class ArmControl:
    """The folded arm state of one run in one replica, kept applied to its router."""

    def __init__(
        self,
        *,
        run_id: str,
        configured: Mapping[str, float],
        control: str,
        store: Control,
        router: Router,
        metrics: ProxyMetrics,
    ) -> None:
        """`configured`: each treatment's configured share; `control`: the arm serving the rest."""
        self.run_id = run_id
        self.control = control
        self.configured: Mapping[str, float] = dict(configured)
        self.state = ArmState(self.configured)
        self.recent: deque[ArmEvent] = deque(maxlen=RECENT_EVENTS)
        self.poll_failures = 0
        self._store = store
        self._router = router
        self._metrics = metrics
        self._failing = False
        self._changed = asyncio.Condition()
        self._apply()

    async def poll(self) -> bool:
        """Read and apply the events after the newest folded one; False (state kept) when the
        store cannot be read."""
        try:
            events = await self._store.arm_events(run_id=self.run_id, after_id=self.state.last_id)
        except Exception as exc:  # any failure of the read: keep the state, count, poll again
            self.poll_failures += 1
            self._metrics.control_poll_failures.inc()
            if not self._failing:
                log.warning("cannot read arm events, keeping the last known state: %s", exc)
            self._failing = True
            return False
        if self._failing:
            log.info("arm events readable again")
            self._failing = False
        await self._fold(events, advance=True)
        return True

    async def submit(self, event: ArmEvent) -> ArmEvent:
        """Store `event` (`StoreError` when that fails), then apply it here at once."""
        stored = await self._store.add_arm_event(event)
        if not await self.poll():
            # Stored but not read back: apply it now without advancing past events between
            # the last folded one and this one; the next poll folds them all in id order.
            await self._fold([stored], advance=False)
        return stored

    async def wait_applied(self, event_id: int) -> None:
        """Return once the event with id `event_id` (or a later one) has been folded."""
        async with self._changed:
            await self._changed.wait_for(lambda: self.state.last_id >= event_id)

    async def _fold(self, events: list[ArmEvent], *, advance: bool) -> None:
        if not events:
            return
        state = self.state.fold(events)
        if not advance:
            state = dataclasses.replace(state, last_id=self.state.last_id)
        for event in events:
            log.info(
                "arm event %d applied: %s %s%s by %s (%s)",
                event.id,
                event.action,
                event.arm,
                "" if event.weight is None else f" weight {event.weight:g}",
                event.who,
                event.why,
            )
            if event not in self.recent:  # applied ahead by `submit`, then read back
                self.recent.append(event)
        self.state = state
        self._apply()
        async with self._changed:
            self._changed.notify_all()

    def _apply(self) -> None:
        state = self.state
        router = self._router
        router.apply(
            {arm: state.weights.get(arm, 0.0) for arm in self.configured},
            on=not state.stopped,
            paused=state.paused & frozenset(self.configured),
        )
        for arm, share in router.shares.items():  # the control's too: it serves the rest
            self._metrics.arm_weight.labels(arm=arm).set(share)
        self._metrics.experiment_stopped.set(1.0 if state.stopped else 0.0)
