"""`BufferedStore`'s flusher: what one periodic flush writes, and what `flush` drains."""

from __future__ import annotations

import asyncio
from pathlib import Path

from specproxy.records import EngineSample, GpuSample, RequestRecord
from specproxy.store.memory import MemoryStore
from tests.store.conftest import make_record, store_config


class _GatedStore(MemoryStore):
    """A memory store whose first write waits for `gate`; it notes every write's size."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(store_config("memory://", tmp_path, batch_size=1000), run_id="run")
        self.gate = asyncio.Event()
        self.writing = asyncio.Event()
        self.sizes: list[int] = []
        self.flushes = 0
        self.writes: list[tuple[int, int]] = []  # (which flush, rows)

    async def _flush_buffers(self, *, drain: bool = True) -> bool:
        self.flushes += 1
        return await super()._flush_buffers(drain=drain)

    async def _write(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        self.sizes.append(len(requests))
        self.writes.append((self.flushes, len(requests)))
        self.writing.set()
        await self.gate.wait()
        await super()._write(requests, engine, gpu)


async def test_a_periodic_flush_writes_what_was_buffered_when_it_began(tmp_path: Path) -> None:
    """Rows recorded while a periodic flush writes wait for the next one: not a string of small
    transactions right after it (each paying a whole batch's commit and rollup upserts)."""
    store = _GatedStore(tmp_path)
    for i in range(10):
        store.record(make_record(i))
    flushing = asyncio.create_task(store._flush_buffers(drain=False))
    await store.writing.wait()
    for i in range(10, 15):
        store.record(make_record(i))
    store.gate.set()
    assert await flushing
    assert store.sizes == [10]
    assert store.pending == 5  # for the next interval
    await store.flush()  # flush (and close) drain everything
    assert store.sizes == [10, 5] and store.pending == 0
    assert store.written == 15


async def test_the_background_flusher_takes_one_batch_per_interval(tmp_path: Path) -> None:
    store = _GatedStore(tmp_path)
    await store.start()
    try:
        for i in range(10):
            store.record(make_record(i))
        await store.writing.wait()  # the flusher's own interval came
        for i in range(10, 15):
            store.record(make_record(i))
        store.writing.clear()
        store.gate.set()
        await store.writing.wait()  # one write of the rows that waited, by a later flush
        [(first, ten), (second, five)] = store.writes
        assert (ten, five) == (10, 5) and second > first
    finally:
        await store.close()
    assert store.written == 15


async def test_a_flush_first_settles_the_calls_the_proxy_has_finished(tmp_path: Path) -> None:
    """`before_reads` (`records.ReadBarrier`): the proxy's records still to be made reach the
    store in the flush that follows, whether a reader's, the flusher's or the last one."""
    store = MemoryStore(store_config("memory://", tmp_path), run_id="run")
    unsettled = [make_record(i) for i in range(3)]

    def settle() -> None:
        while unsettled:
            store.record(unsettled.pop(0))

    store.before_reads(settle)
    await store.flush()
    assert store.written == 3 and store.pending == 0
    unsettled.append(make_record(3))
    await store.close()
    assert store.written == 4
