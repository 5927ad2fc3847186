"""Batching, background flushing and spilling, shared by every backend.

The proxy's hot path calls `record()`, which only appends to an in-memory deque (or, during a
store outage or once `max_buffer` rows are waiting, appends one line to the local spill file). A
background task writes batches at least every `flush_interval_s`. When a write fails the store is
down: the buffered rows (the failed batch included) go to the spill file at once, and so does
every row recorded until a write works again. A write that hangs instead (a locked SQLite file
waits its lock timeout, 5 s; an unreachable PostgreSQL its command timeout, 30 s) counts as an
outage once it has taken `STALLED_WRITE_S`: the buffered rows spill then, and so does every row
recorded until it ends. So a SIGKILL in an outage loses at most the batch being written (at most
`batch_size` rows, recorded in the flush interval before the write began) and the rows recorded
in the `STALLED_WRITE_S` after it began: about `flush_interval_s` + 1 s of traffic (1.5 s by
default), whatever the backend's timeouts. The task retries with backoff; once writes work
again the spill files are replayed. Nothing is ever discarded silently:
`dropped` counts only rows the database refuses for good (kept in `<spill_path>.rejected`),
unreadable spill lines, and, when the spill file cannot be written either, rows beyond
`MEMORY_FACTOR x max_buffer` held in memory.

`BufferedStore` implements the `contract.Sink` and `contract.Lifecycle` protocols once, for every
backend; a backend adds the `_open`, `_write`, `_close_backend`, `_purge`, `_purge_rollups` and
`_compact` hooks and implements the readers (`SummaryReader`, `History`, `Export`) and the
arm-control events (`Control`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import logging
import math
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from specproxy.config import StoreConfig
from specproxy.errors import StoreError
from specproxy.records import EngineSample, GpuSample, RequestRecord
from specproxy.store.contract import (
    Control,
    Export,
    Fold,
    History,
    Lifecycle,
    Sink,
    SummaryReader,
)
from specproxy.store.spill import Row, Sample, SpillSet
from specproxy.summary.minute import ROLLUP_UNIT_S, as_is
from specproxy.summary.tiering import CompactionBounds

__all__ = ["FOLD_BATCH_ROWS", "MEMORY_FACTOR", "STALLED_WRITE_S", "BufferedStore"]

log = logging.getLogger(__name__)

MAX_RETRY_DELAY_S = 5.0
CLOSE_FLUSH_TIMEOUT_S = 15.0
PURGE_INTERVAL_S = 3600.0


# Rows held in memory when the spill file cannot be written either, as a multiple of max_buffer.
MEMORY_FACTOR: Final = 2
# A write still running after this long is an outage until it ends: new rows go to the spill
# file instead of waiting in memory for the backend's own timeout (SIGKILL would lose them).
STALLED_WRITE_S: Final = 1.0
# Pending rows one transaction of `fold_pending` takes and rolls up (a 10 s tick at 1k req/s is
# one batch; a backlog goes in several, each holding the write lock briefly).
FOLD_BATCH_ROWS: Final = 20_000


class BufferedStore(Sink, Lifecycle, SummaryReader, History, Export, Control, abc.ABC):
    """The sink half and life cycle of every backend: buffer, flusher task, spill, counters and
    retention. A backend subclass adds the hooks and the readers."""

    def __init__(self, cfg: StoreConfig, *, run_id: str = "default") -> None:
        self.cfg = cfg
        self.run_id = run_id
        self._requests: deque[RequestRecord] = deque()
        self._engine: deque[Sample] = deque()  # engine and GPU samples, in arrival order
        self._inflight = 0
        self._spill = SpillSet(cfg.spill_path)
        self._written = 0
        self._dropped = 0
        self._spill_failing = False
        self._healthy = True
        self._stalled = False  # a write has run past STALLED_WRITE_S and not ended yet
        self._opened = False
        self._closed = False
        self._started = False
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._lock = asyncio.Lock()
        self._open_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._next_purge = 0.0
        self._read_only = False
        self._model_label: Callable[[str], str] = as_is  # rollup keys (`label_models`)
        self._settle: Callable[[], None] | None = None  # the proxy's read barrier

    # -- backend hooks -------------------------------------------------------------------------

    @abc.abstractmethod
    async def _open(self) -> None:
        """Connect and run migrations. Raise on failure."""

    @abc.abstractmethod
    async def _write(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        """Insert the lists in one transaction, ignoring rows already present. Raise on failure."""

    async def _write_split(self, requests: list[RequestRecord], samples: list[Sample]) -> None:
        """`_write` with the queued samples sorted into engine and GPU ones."""
        engine = [s for s in samples if isinstance(s, EngineSample)]
        gpu = [s for s in samples if isinstance(s, GpuSample)]
        await self._write(requests, engine, gpu)

    @abc.abstractmethod
    async def _close_backend(self) -> None:
        """Release connections and threads."""

    @abc.abstractmethod
    async def _purge(self, before: float) -> int:
        """Delete rows older than `before` (Unix time); return how many went."""

    @abc.abstractmethod
    async def _purge_rollups(self, before_minute: int) -> int:
        """Delete rollups of minutes before `before_minute`; return how many rows went."""

    @abc.abstractmethod
    async def _compact(self, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        """`compact` with its bounds: one transaction; return the rows taken."""

    async def compact(self, *, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        await self._ensure_open()
        return await self._compact(run_id, bounds, fold)

    @property
    def deferred(self) -> bool:
        """Whether this store's writes leave the rollups to the stats leader (`fold_pending`)."""
        return self.cfg.rollups == "deferred"

    @abc.abstractmethod
    async def _fold_pending(self) -> int:
        """`fold_pending`: take the pending rows batch by batch, each batch with its rollups in
        one transaction; return the rows folded."""

    async def fold_pending(self) -> int:
        await self._ensure_open()
        return await self._fold_pending()

    def _rejects_rows(self, exc: BaseException) -> bool:
        """Whether a failed write means bad rows (never succeeds) rather than an outage.

        Only errors known to be about the data count; anything unknown is retried, because
        retrying costs memory and disk while giving up loses records.
        """
        return isinstance(exc, ValueError | TypeError | OverflowError)

    def _is_misconfigured(self, exc: BaseException) -> bool:
        """Whether opening failed for a reason that waiting will not fix (bad credentials)."""
        return False

    # -- counters ------------------------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Rows not yet in the store: buffered, being written, or waiting in spill files."""
        return len(self._requests) + len(self._engine) + self._inflight + self._spill.pending_rows

    @property
    def dropped(self) -> int:
        return self._dropped

    @property
    def spilled(self) -> int:
        """Rows ever written to a spill file (a counter; replay does not decrease it)."""
        return self._spill.total_spilled

    @property
    def written(self) -> int:
        """Rows handed to the store in successful transactions (replays included)."""
        return self._written

    @property
    def healthy(self) -> bool:
        """False while the last write failed."""
        return self._healthy

    # -- lifecycle -----------------------------------------------------------------------------

    async def start(self, *, read_only: bool = False) -> None:
        """Open the store; `read_only` (stats, report, export) opens it for reading alone: no
        flusher, no spill files claimed or replayed, and `record` refuses."""
        if self._started:
            return
        self._started = True
        self._read_only = read_only
        if read_only:
            if not await self._try_open():
                raise StoreError(f"cannot open store {self.cfg.url}")
            return
        await asyncio.to_thread(self._spill.claim_leftovers)
        await self._try_open()
        self._task = asyncio.create_task(self._run(), name=f"store-flusher-{self.run_id}")

    async def close(self) -> None:
        if self._closed:
            return
        if self._settle is not None:
            self._settle()  # into the buffer the last flush writes, not the spill file
        self._closed = True
        if self._read_only:
            with contextlib.suppress(Exception):
                await self._close_backend()
            return
        self._stop.set()
        self._wake.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(self._task, CLOSE_FLUSH_TIMEOUT_S)
            except TimeoutError:  # a write hung; its batch went back to the buffer
                self._healthy = False
        try:
            await asyncio.wait_for(self._flush_buffers(), CLOSE_FLUSH_TIMEOUT_S)
        except TimeoutError:
            self._healthy = False
        if self._requests or self._engine:
            self._spill_buffers()
        left = self._spill.pending_rows
        await asyncio.to_thread(self._spill.close)
        with contextlib.suppress(Exception):
            await self._close_backend()
        if left:
            log.warning("store closed with %d rows in spill files; replayed at next start", left)

    # -- writing -------------------------------------------------------------------------------

    def record(self, rec: RequestRecord) -> None:
        if self._read_only:
            raise StoreError("store opened read-only")
        self._enqueue(rec, self._requests)

    def before_reads(self, settle: Callable[[], None]) -> None:
        """`records.ReadBarrier`: every flush first settles the calls the proxy has finished."""
        self._settle = settle

    def label_models(self, model_label: Callable[[str], str]) -> None:
        self._model_label = model_label

    def record_engine(self, sample: EngineSample) -> None:
        self._enqueue(sample, self._engine)

    def record_gpu(self, sample: GpuSample) -> None:
        self._enqueue(sample, self._engine)

    async def flush(self) -> None:
        """Write the buffers and replay spill files; StoreError when the store is unavailable."""
        if not await self._flush_buffers() or not await self._replay():
            raise StoreError("store unavailable: rows kept in memory / spill file for later")

    def _enqueue(self, row: Any, queue: deque[Any]) -> None:
        try:
            if self._closed:
                # After close (late records on shutdown): straight to disk, replayed next start.
                self._spill_rows([row])
                return
            if (
                not self._healthy
                or self._stalled
                or len(self._requests) + len(self._engine) >= self.cfg.max_buffer
            ):
                self._spill_rows([row])  # in an outage, straight to disk: SIGKILL loses none
                return
            queue.append(row)
            if len(queue) >= self.cfg.batch_size:
                self._wake.set()
        except Exception:  # never let the hot path fail
            log.exception("store: could not queue a row; keeping it in memory")
            self._keep_in_memory([row])

    def _spill_rows(self, rows: list[Row]) -> None:
        try:
            self._spill.append(rows)
        except OSError:
            if not self._spill_failing:  # once per outage, not once per row
                log.exception("store: spill file not writable; keeping rows in memory")
            self._keep_in_memory(rows)
        else:
            self._spill_failing = False

    def _keep_in_memory(self, rows: list[Row]) -> None:
        """The last resort when neither the store nor the spill file takes rows: memory, up to
        `MEMORY_FACTOR x max_buffer` rows in all; beyond that a row is dropped and counted
        (`specproxy_store_dropped_total`, which pages), so a dead disk cannot exhaust memory."""
        self._spill_failing = True
        for row in rows:
            if len(self._requests) + len(self._engine) >= MEMORY_FACTOR * self.cfg.max_buffer:
                self._dropped += 1
                continue
            if isinstance(row, RequestRecord):
                self._requests.append(row)
            else:
                self._engine.append(row)

    def _spill_buffers(self) -> None:
        rows: list[Row] = [*self._requests, *self._engine]
        self._requests.clear()
        self._engine.clear()
        try:
            self._spill.append(rows)
        except OSError:
            self._dropped += len(rows)
            log.critical("store: %d rows lost, spill file not writable at shutdown", len(rows))

    def is_open(self) -> bool:
        return self._opened

    async def _ensure_open(self) -> None:
        """For reads and direct writes: open now or raise StoreError."""
        if not await self._try_open():
            raise StoreError("store unavailable")

    async def _try_open(self) -> bool:
        if self._opened:
            return True
        async with self._open_lock:
            if self.is_open():  # another task opened it while we waited
                return True
            try:
                await self._open()
            except StoreError:
                raise
            except Exception as exc:
                if self._is_misconfigured(exc):
                    raise StoreError(f"cannot open store: {exc}") from exc
                self._mark_down(exc)
                return False
            self._opened = True
            return True

    def _mark_down(self, exc: BaseException) -> None:
        if self._healthy:
            log.warning(
                "store unavailable (%s); buffering, then spilling to %s", exc, self._spill.base
            )
        self._healthy = False

    def _mark_up(self) -> None:
        if not self._healthy:
            log.info("store available again")
        self._healthy = True

    async def _flush_buffers(self, *, drain: bool = True) -> bool:
        """Write what is buffered, in batches of `batch_size`; False when the store failed (rows
        stay buffered). `drain`: also what arrives meanwhile, until the buffers are empty
        (`flush`, `close`); else only the rows buffered when it began (the periodic flusher:
        rows recorded during its write wait for the next interval instead of being written as
        a string of small transactions right after it, each paying a commit and the rollup
        upserts of its keys: one serve process under load made 53-69 transactions in 5 s instead
        of 9, at 32-43 instead of 26-31 us of writer CPU per row)."""
        if self._settle is not None:
            self._settle()
        async with self._lock:
            if not await self._try_open():
                return False
            left = None if drain else len(self._requests) + len(self._engine)
            while (self._requests or self._engine) and (left is None or left > 0):
                size = self.cfg.batch_size
                reqs = [self._requests.popleft() for _ in range(min(size, len(self._requests)))]
                engs = [self._engine.popleft() for _ in range(min(size, len(self._engine)))]
                if left is not None:
                    left -= len(reqs) + len(engs)
                if not await self._write_rows(reqs, engs, requeue=True):
                    return False
            return True

    async def _write_rows(
        self, reqs: list[RequestRecord], engs: list[Sample], *, requeue: bool
    ) -> bool:
        count = len(reqs) + len(engs)
        self._inflight += count if requeue else 0
        stall = asyncio.get_running_loop().call_later(STALLED_WRITE_S, self._write_stalled)
        try:
            await self._write_split(reqs, engs)
        except asyncio.CancelledError:  # shutdown timeout: keep the batch for the spill
            if requeue:
                self._requests.extendleft(reversed(reqs))
                self._engine.extendleft(reversed(engs))
            raise
        except Exception as exc:
            if not self._rejects_rows(exc):
                if requeue:
                    self._requests.extendleft(reversed(reqs))
                    self._engine.extendleft(reversed(engs))
                self._mark_down(exc)
                return False
            if not await self._write_one_by_one(reqs, engs, exc):
                if requeue:
                    self._requests.extendleft(reversed(reqs))
                    self._engine.extendleft(reversed(engs))
                return False
        else:
            self._written += count
        finally:
            self._inflight -= count if requeue else 0
            stall.cancel()
            self._stalled = False  # failed: `_healthy` is False and rows keep spilling
        self._mark_up()
        return True

    def _write_stalled(self) -> None:
        """A write has run for STALLED_WRITE_S: until it ends, the store is down for new rows,
        and what waits in memory goes to the spill file now (it survives a SIGKILL)."""
        if self._healthy and not self._stalled:
            log.warning(
                "store: a write has taken more than %g s; spilling rows to %s until it ends",
                STALLED_WRITE_S,
                self._spill.base,
            )
        self._stalled = True
        self._spill_outage()

    async def _write_one_by_one(
        self, reqs: list[RequestRecord], engs: list[Sample], exc: BaseException
    ) -> bool:
        """A batch the database refuses: isolate the bad rows, write the others.

        Returns False (nothing counted as lost) if the store goes down meanwhile; the batch is
        retried whole later, and rows already written are ignored as duplicates then.
        """
        log.error("store refused a batch (%s); retrying row by row", exc)
        rows: list[Row] = [*reqs, *engs]
        refused: list[tuple[Row, Exception]] = []
        for row in rows:
            single_r = [row] if isinstance(row, RequestRecord) else []
            single_e = [] if isinstance(row, RequestRecord) else [row]
            try:
                await self._write_split(single_r, single_e)
            except Exception as row_exc:
                if not self._rejects_rows(row_exc):
                    self._mark_down(row_exc)
                    return False
                refused.append((row, row_exc))
        for row, reason in refused:
            self._dropped += 1
            self._spill.reject([row], repr(reason))
            log.error("store refused a row for good (%s): %r", reason, row)
        self._written += len(rows) - len(refused)
        return True

    async def _replay(self) -> bool:
        """Replay spill files into the store. False when the store failed again."""
        async with self._lock:
            if self._spill.pending_rows == 0 and not self._spill.backlog:
                return True
            if not await self._try_open():
                return False
            self._spill.rotate()
            while self._spill.backlog:
                spill = self._spill.backlog[0]
                chunks = spill.chunks(self.cfg.batch_size)
                while True:
                    chunk = await asyncio.to_thread(next, chunks, None)
                    if chunk is None:
                        break
                    if chunk.bad_lines:
                        self._dropped += chunk.bad_lines
                    if not await self._write_rows(chunk.requests, chunk.engine, requeue=False):
                        return False
                self._spill.backlog.pop(0)
                await asyncio.to_thread(spill.release, delete=True)
                log.info("replayed %d spilled rows from %s", spill.rows, spill.path)
            return True

    async def _run(self) -> None:
        delay = self.cfg.flush_interval_s
        while not self._stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), delay)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                ok = await self._flush_buffers(drain=False) and await self._replay()
                if ok:
                    await self._maybe_purge()
            except Exception:
                log.exception("store flusher: unexpected error")
                ok = False
            delay = self.cfg.flush_interval_s if ok else min(delay * 2, MAX_RETRY_DELAY_S)
            if not ok and not self._healthy:
                self._spill_outage()

    def _spill_outage(self) -> None:
        """The store is down: move what is buffered to the spill file, which survives SIGKILL
        (rows the spill file refuses stay in memory, `_keep_in_memory`)."""
        rows: list[Row] = [*self._requests, *self._engine]
        if not rows:
            return
        self._requests.clear()
        self._engine.clear()
        self._spill_rows(rows)

    async def _maybe_purge(self) -> None:
        days = self.cfg.retention_days
        rollup_days = self.cfg.rollup_retention_days
        now = time.time()
        if (days is None and rollup_days is None) or now < self._next_purge:
            return
        self._next_purge = now + PURGE_INTERVAL_S
        if days is not None:
            await self.purge_older_than(now - days * 86400.0)
        if rollup_days is not None:
            await self.purge_rollups_older_than(now - rollup_days * 86400.0)

    async def purge_rollups_older_than(self, before: float) -> int:
        """Rollup retention: delete rollups of minutes that ended before `before`."""
        async with self._lock:
            if not await self._try_open():
                raise StoreError("store unavailable")
            removed = await self._purge_rollups(math.floor(before / ROLLUP_UNIT_S))
        if removed:
            log.info("retention: removed %d rollup rows older than %.0f", removed, before)
        return removed

    async def purge_older_than(self, before: float) -> int:
        """Retention: delete requests, engine and GPU samples and stats older than `before`."""
        async with self._lock:
            if not await self._try_open():
                raise StoreError("store unavailable")
            removed = await self._purge(before)
        if removed:
            log.info("retention: removed %d rows older than %.0f", removed, before)
        return removed
