"""Outages: rows buffer up to `max_buffer`, spill to disk, and are replayed exactly once."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from specproxy.errors import StoreError
from specproxy.records import EngineSample, GpuSample
from specproxy.store.buffered import MEMORY_FACTOR, BufferedStore
from specproxy.store.factory import open_store
from specproxy.store.memory import MemoryStore
from specproxy.store.spill import Row, SpillSet, decode_line, encode_row
from tests.store.conftest import eventually, make_record, store_config
from tests.store.helpers import read_arrays
from tests.store.pgcluster import PgCluster


async def _count(store: BufferedStore, run_id: str = "run") -> tuple[int, int]:
    arrays = await read_arrays(store, run_id=run_id, columns=["request_id"])
    ids = [i for a in arrays.values() for i in a["request_id"]]
    return len(ids), len(set(ids))


async def _wait_unhealthy(store: BufferedStore) -> None:
    await eventually(lambda: not store.healthy)


def _spill_files(tmp_path: Path) -> list[Path]:
    return sorted(p for p in (tmp_path / "spill").glob("spill.jsonl*") if p.stat().st_size)


async def test_memory_outage_spills_then_replays(tmp_path: Path) -> None:
    store = open_store(store_config("memory://", tmp_path, max_buffer=50))
    assert isinstance(store, MemoryStore)
    await store.start()
    store.fail_writes = True
    for i in range(200):
        store.record(make_record(i))
    with pytest.raises(StoreError):
        await store.flush()
    assert store.spilled >= 150 and store.pending == 200
    assert _spill_files(tmp_path)
    store.fail_writes = False
    await store.flush()
    assert await _count(store) == (200, 200)
    assert store.pending == 0 and store.dropped == 0
    assert not _spill_files(tmp_path)
    await store.close()


async def test_sqlite_lock_outage_is_survived(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    cfg = store_config(f"sqlite:///{db}?timeout=0.05", tmp_path, max_buffer=100, batch_size=50)
    store = open_store(cfg)
    await store.start()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the database: writes fail
    for i in range(300):
        store.record(make_record(i))
    await _wait_unhealthy(store)
    assert store.spilled >= 150 and store.pending == 300
    blocker.execute("ROLLBACK")
    blocker.close()
    await store.flush()
    assert await _count(store) == (300, 300)
    assert store.pending == 0 and store.dropped == 0 and store.healthy
    await store.close()
    assert not _spill_files(tmp_path)


async def test_a_hung_write_spills_the_rows_behind_it(tmp_path: Path) -> None:
    """A write that hangs (the database locked far past STALLED_WRITE_S, inside SQLite's lock
    timeout) is an outage for the rows waiting behind it: they go to the spill file, where a
    SIGKILL cannot take them, instead of memory until the lock timeout; each is stored once."""
    db = tmp_path / "store.db"
    batch = 10
    store = open_store(store_config(f"sqlite:///{db}?timeout=600", tmp_path, batch_size=batch))
    await store.start()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # the next write waits (up to 600 s) for the lock
    try:
        for i in range(100):
            store.record(make_record(i))
        # the flusher took one batch into the hung write; the rest spill once it is stalled
        await eventually(lambda: store.spilled == 100 - batch, timeout_s=120)
        assert store.healthy  # no write has failed: only stalled
        for i in range(100, 150):
            store.record(make_record(i))  # while it hangs: straight to the spill file
        assert store.spilled == 150 - batch and store.pending == 150
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await store.flush()
    assert await _count(store) == (150, 150)
    assert store.pending == 0 and store.dropped == 0 and store.healthy
    await store.close()
    assert not _spill_files(tmp_path)


async def test_close_during_outage_leaves_spill_replayed_at_next_start(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    cfg = store_config(f"sqlite:///{db}?timeout=0.05", tmp_path, max_buffer=1000)
    first = open_store(cfg)
    await first.start()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    for i in range(120):
        first.record(make_record(i))
    await first.close()  # SIGTERM while the store is down: everything goes to the spill file
    assert first.dropped == 0 and first.spilled == 120
    assert _spill_files(tmp_path)
    blocker.execute("ROLLBACK")
    blocker.close()
    second = open_store(cfg)
    await second.start()
    await second.flush()
    assert await _count(second) == (120, 120)
    assert second.pending == 0 and second.dropped == 0
    await second.close()
    assert not _spill_files(tmp_path)


async def test_postgres_outage_is_survived(own_pg_cluster: PgCluster, tmp_path: Path) -> None:
    cfg = store_config(own_pg_cluster.url, tmp_path, max_buffer=100, batch_size=50)
    store = open_store(cfg)
    await store.start()
    for i in range(50):
        store.record(make_record(i))
    await store.flush()
    own_pg_cluster.stop()
    for i in range(50, 400):
        store.record(make_record(i))
    await _wait_unhealthy(store)
    assert store.spilled >= 200
    with pytest.raises(StoreError):
        await store.flush()
    own_pg_cluster.start()
    await eventually(lambda: store.pending == 0)  # the flusher replays on its own
    assert store.pending == 0 and store.healthy
    assert await _count(store) == (400, 400)
    assert store.dropped == 0
    assert not _spill_files(tmp_path)
    await store.close()


def test_live_owner_keeps_its_spill_file(tmp_path: Path) -> None:
    base = tmp_path / "spill.jsonl"
    owner, other = SpillSet(base), SpillSet(base)
    owner.append([make_record(1), make_record(2, arm="baseline")])
    assert other.claim_leftovers() == 0  # locked by a live process
    owner.close()  # the owner exits without replaying: its lock goes, the file stays
    assert other.claim_leftovers() == 2
    chunks = list(other.backlog[0].chunks(10))
    assert [r.request_id for c in chunks for r in c.requests] == ["req-1", "req-2"]
    other.close()


async def test_read_only_start_leaves_spill_files_alone_and_refuses_writes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """stats / report open the store read-only: the writer's spill files stay for the writer."""
    db = tmp_path / "store.db"
    cfg = store_config(f"sqlite:///{db}?timeout=0.05", tmp_path, max_buffer=1000)
    writer = open_store(cfg)
    await writer.start()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    for i in range(30):
        writer.record(make_record(i))
    await writer.close()  # the store was locked: the rows wait in a spill file
    blocker.execute("ROLLBACK")
    blocker.close()
    spilled = _spill_files(tmp_path)
    assert spilled
    caplog.clear()
    reader = open_store(cfg)
    await reader.start(read_only=True)
    assert await _count(reader) == (0, 0)  # nothing replayed by a reader
    with pytest.raises(StoreError, match="read-only"):
        reader.record(make_record(99))
    await reader.close()
    assert _spill_files(tmp_path) == spilled
    assert not [r for r in caplog.records if "spill" in r.getMessage()]


async def test_unwritable_spill_keeps_at_most_twice_max_buffer_in_memory(tmp_path: Path) -> None:
    """Store down and spill file unwritable: memory holds MEMORY_FACTOR x max_buffer rows, the
    rest is counted as dropped (which pages) instead of growing without bound."""
    (tmp_path / "not-a-dir").write_text("a file where the spill directory should be")
    cfg = store_config(
        "memory://", tmp_path, max_buffer=50, spill_path=str(tmp_path / "not-a-dir" / "s.jsonl")
    )
    store = open_store(cfg)
    assert isinstance(store, MemoryStore)
    await store.start()
    store.fail_writes = True
    for i in range(500):
        store.record(make_record(i))
    with pytest.raises(StoreError):
        await store.flush()
    assert store.pending == MEMORY_FACTOR * 50
    assert store.dropped == 500 - MEMORY_FACTOR * 50
    store.fail_writes = False
    await store.flush()
    assert await _count(store) == (MEMORY_FACTOR * 50, MEMORY_FACTOR * 50)
    await store.close()


async def test_gpu_samples_spilled_at_close_are_replayed_at_next_start(tmp_path: Path) -> None:
    # The GPU scraper's rows take the engine samples' path: buffered, spilled when the store is
    # down at shutdown, replayed into `gpu_samples` by the next process, each exactly once.
    db = tmp_path / "store.db"
    cfg = store_config(f"sqlite:///{db}?timeout=0.05", tmp_path, max_buffer=1000)
    first = open_store(cfg)
    await first.start()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")
    gpu = [
        GpuSample(
            t=float(t),
            arm="speculative",
            up=True,
            run_id="run",
            gpus=1,
            memory_bandwidth=0.95,
            clock_reasons=("sw_thermal",) if t % 2 else (),
            thermal_throttled=bool(t % 2),
        )
        for t in range(30)
    ]
    down = GpuSample(t=5.5, arm="baseline", up=False, run_id="run", error="HTTP 503")
    for sample in [*gpu, down]:
        first.record_gpu(sample)
    first.record_engine(EngineSample(t=1.0, run_id="run", arm="baseline", up=True))
    first.record(make_record(1))
    await first.close()
    assert first.dropped == 0 and first.spilled == 33
    blocker.execute("ROLLBACK")
    blocker.close()
    second = open_store(cfg)
    await second.start()
    await second.flush()
    assert await second.read_gpu_samples(run_id="run") == {
        "speculative": gpu,
        "baseline": [down],
    }
    assert len(await second.read_engine_samples(run_id="run")) == 1
    assert await _count(second) == (1, 1)
    assert second.pending == 0 and second.dropped == 0
    await second.close()
    assert not _spill_files(tmp_path)


def test_spill_lines_keep_each_row_kind() -> None:
    rows: list[Row] = [
        make_record(1),
        EngineSample(t=1.0, run_id="run", arm="baseline", up=True, position_acceptance=(0.5,)),
        GpuSample(t=1.0, arm="baseline", up=True, run_id="r", clock_reasons=("hw_slowdown",)),
        GpuSample(t=2.0, arm="baseline", up=False, run_id="r", error="refused"),
    ]
    assert [decode_line(encode_row(row)) for row in rows] == rows
