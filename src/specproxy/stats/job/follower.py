"""What a proxy process does with the statistics: serve the latest result the computing process
stored.

The proxy relays and records; a separate process computes (`specproxy stats --follow`, started by
serve as its child or run elsewhere, `stats.job.process`) and appends each result to the store's
history. Every `stats.interval_s` the follower asks the store for a result newer than the one it
holds and, when there is one, serves it (`GET /api/stats`, `/ui`, the stats gauges). Nothing here
computes: this module, and what it imports at run time, stays free of numpy and scipy, so a
proxy that only follows never loads them.

A result the leader stored long ago is not picked up by a follower that starts later: the read
is bounded to the last few intervals (`FOLLOW_INTERVALS`, `FOLLOW_SLACK_S`), so a proxy whose
computing process has stopped serves nothing new, its `computed_at` gauge ages and
`SpecProxyStatsStale` fires.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, cast

from specproxy.stats.result import StatsResult
from specproxy.tasks import cancel_and_wait

__all__ = ["FOLLOW_INTERVALS", "FOLLOW_SLACK_S", "StatsFollower", "StatsHistory"]

log = logging.getLogger(__name__)

# How far back a follower looks for a stored result: this many intervals plus the slack.
FOLLOW_INTERVALS = 3
FOLLOW_SLACK_S = 60.0


class StatsHistory(Protocol):
    """The store's stats history, as far as a follower reads it (`store.contract.History`)."""

    async def latest_stats(
        self, *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None: ...


class StatsFollower:
    """Polls the store's history every `interval_s` and keeps the newest result it found."""

    def __init__(
        self,
        store: StatsHistory,
        *,
        run_id: str,
        interval_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._run_id = run_id
        self._interval_s = interval_s
        self._clock = clock
        self._latest: StatsResult | None = None
        self._held_t: float | None = None  # history time of the result held
        self._task: asyncio.Task[None] | None = None

    def latest(self) -> StatsResult | None:
        """The newest stored result found so far, None before the first."""
        return self._latest

    async def follow_once(self) -> StatsResult | None:
        """Take the newest stored result if it is newer than the one held (a bounded read)."""
        since = self._clock() - FOLLOW_INTERVALS * self._interval_s - FOLLOW_SLACK_S
        if self._held_t is not None:
            # Only a row after the one held: it is not read (and decoded) again every interval.
            since = max(since, self._held_t)
        newest = await self._store.latest_stats(run_id=self._run_id, newer_than=since)
        if newest is not None:
            t, result = newest
            if self._held_t is None or t > self._held_t:
                self._held_t = t
                self._latest = cast(StatsResult, result)  # what the leader stored
        return self._latest

    async def _loop(self) -> None:
        while True:
            try:
                await self.follow_once()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stats: could not read the stored result; retrying next interval")
            await asyncio.sleep(self._interval_s)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="specproxy-stats-follower")

    async def close(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
