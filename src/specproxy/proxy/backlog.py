"""Finished calls recorded in the proxy's spare moment, and the barrier every reader passes.

Making a call's record (`Trace.to_record`) and its Prometheus samples costs a few microseconds
in a loop, but 25-35 us on a busy proxy's event loop, where aiohttp's own work between two
requests leaves the caches cold (measured in situ, `docs/performance.md`). A proxy kept busy
back to back on one connection would pay that between an answer and the next request: the
client's next request arrives while the record is being made. So a finished call's trace waits
here, and is *settled* (made into its record, which goes to the recorder, the observer and the
counters) at the first of:

- **the next call's wait for its engine**: `soon` is called once a call is on its way
  upstream, and the backlog settles in the loop's next turn, while the engine works (the one
  moment a busy proxy has nothing else to do);
- **its deadline**: `deadline_s` (0.5 ms) after the call ended, when no call has gone upstream
  since: a proxy that is not kept busy records in its idle time, soon after the answer, as it
  did before the backlog (a call that waits for the next one's engine wait would pay for the
  record there, with the caches gone cold meanwhile: 20 us more of added latency, one request
  to each target in turn on the device). The timer is one per backlog, re-armed for the oldest
  trace and cancelled once the backlog is empty;
- **a read**: `settle()` is the read barrier. Whatever reads what records feed calls it first:
  the memory recorder's `records`, a store's `flush`, a Prometheus collect on the loop's thread,
  `/metrics`, and shutdown (`close`, after which every trace settles at once).

Nothing is lost or reordered: traces settle in the order they ended, each with the moment it
ended (`Trace.to_record`'s `now`: the end of a call that never saw its last byte). Settling runs
on the event loop only; `settle()` from another thread is a no-op (its reader then sees at most
`deadline_s` of calls late, as a Prometheus scrape in a worker thread does).

A forwarder whose calls must be recorded the moment they end (a span or an access-log line
carries that moment) uses `Backlog(defer=False)`: every trace settles at once.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from specproxy.proxy.trace import Trace

__all__ = ["DEADLINE_S", "Backlog"]

log = logging.getLogger(__name__)

# The longest a finished call waits for its record: past the next request's way up to its engine
# when the proxy is kept busy back to back (~0.1 ms on the device), short of a client's next
# request when it is not.
DEADLINE_S: Final = 0.0005
_SLACK_S: Final = 0.00005  # a timer this close to the deadline settles rather than re-arms


class Backlog:
    """Traces of finished calls, settled by `settle_one(trace, ended)` (see the module)."""

    __slots__ = (
        "_clock",
        "_closed",
        "_deadline",
        "_defer",
        "_queue",
        "_settle_one",
        "_soon",
        "_thread",
        "_timer",
    )

    def __init__(
        self,
        settle_one: Callable[[Trace, float], object],
        *,
        defer: bool = True,
        deadline_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        """`clock` stamps when each call ended (the request path's clock, `perf_counter`)."""
        self._settle_one = settle_one
        self._defer = defer
        self._deadline = DEADLINE_S if deadline_s is None else deadline_s
        self._clock = clock
        self._queue: list[tuple[Trace, float]] = []
        self._timer: asyncio.TimerHandle | None = None
        self._soon = False  # a settle is scheduled for the loop's next turn
        self._thread: int | None = None  # the event loop's, from the first trace
        self._closed = False

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, trace: Trace) -> None:
        """A call is over (its response sent, or it failed): record it soon. Never raises."""
        ended = self._clock()
        if not self._defer or self._closed:
            self._settle((trace, ended))
            return
        self._queue.append((trace, ended))
        if self._timer is None:
            self._thread = threading.get_ident()
            self._timer = asyncio.get_running_loop().call_later(self._deadline, self._due)

    def soon(self) -> None:
        """A call went upstream and waits for its engine: settle in the loop's next turn."""
        if self._queue and not self._soon:
            self._soon = True
            asyncio.get_running_loop().call_soon(self._settle_soon)

    def settle(self) -> None:
        """The read barrier: every finished call's record is made now (on the loop's thread)."""
        queue = self._queue
        if not queue or threading.get_ident() != self._thread:
            return
        self._queue = []
        timer = self._timer
        if timer is not None:  # nothing left to wait for: no wakeup in the next call's way
            timer.cancel()
            self._timer = None
        for item in queue:
            self._settle(item)

    def close(self) -> None:
        """Settle what is left (which cancels the timer); from now on every trace settles as
        it is added."""
        self.settle()
        self._closed = True

    def _settle(self, item: tuple[Trace, float]) -> None:
        try:
            self._settle_one(*item)
        except Exception:  # a bug must not lose the records queued behind this one
            log.exception("could not record request %s", item[0].request_id)

    def _settle_soon(self) -> None:
        self._soon = False
        self.settle()

    def _due(self) -> None:
        """The timer: settle if the oldest trace is due, else wait for it."""
        self._timer = None
        if not self._queue:
            return
        wait = self._queue[0][1] + self._deadline - self._clock()
        if wait > _SLACK_S:
            self._timer = asyncio.get_running_loop().call_later(wait, self._due)
        else:
            self.settle()
