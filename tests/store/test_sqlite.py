"""SQLite reads (the standard library's sqlite3, in worker threads): the stored values whatever
the filters, by the (run_id, arm, t_start) index, beside the writer thread under WAL."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from specproxy.errors import ErrorKind
from specproxy.records import RECORD_FIELDS, Arm, RequestRecord
from specproxy.store.factory import open_store
from specproxy.store.queries import RecordQuery, records_sql, with_arm
from specproxy.store.sqlite import WAL_SIZE_LIMIT_BYTES, SqliteStore
from tests.store.conftest import make_record, store_config

T0 = 1_700_000_000.0
N = 3000


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = open_store(store_config(f"sqlite:///{tmp_path}/store.db", tmp_path, batch_size=1000))
    assert isinstance(store, SqliteStore)
    await store.start()
    yield store
    await store.close()
    assert store.dropped == 0


def varied_record(i: int) -> RequestRecord:
    """Records with leading runs of NULL (ttft, acceptance, pair_id, error), both arms, two runs,
    shadows, failures and disconnects."""
    late = i >= 2000
    return make_record(
        i,
        run_id="run" if i % 7 else "other",
        t_start=T0 + i * 0.5,
        model="a" if i % 3 else "b",
        stream=bool(i % 2),
        status=200 if i % 11 else 500,
        ttft_s=0.01 * (i % 13) if late else None,
        tpot_s=None if i % 5 == 0 else 0.002 * (i % 17),
        prompt_tokens=i % 300 if late else None,
        output_tokens=None if i % 9 == 0 else i % 512,
        acceptance_rate=0.5 + (i % 10) / 20 if late and i % 2 else None,
        pair_id=f"pair-{i // 2}" if late else None,
        shadow=i % 4 == 0,
        error_kind=ErrorKind.BROKEN if late and i % 11 == 0 else None,
        disconnected=i % 97 == 0,
    )


FILTERS: list[dict[str, Any]] = [
    {},
    {"since": T0 + 600.0},
    {"until": T0 + 1200.0},
    {"since": T0 + 100.25, "until": T0 + 1300.0},
    {"usable_only": True},
    {"since": T0 + 1000.0, "usable_only": True},
    {"since": T0 + 1e6},  # nothing in the window
    {"run_id": "other"},
    {"run_id": "missing"},
    {"ended_since": T0 + 300.0, "ended_until": T0 + 330.0},
    {"ended_since": T0 + 300.0, "ended_until": T0 + 900.0, "since": T0 + 500.0},
    {"ended_since": T0 + 1400.0, "usable_only": True},
]


def _expected(filters: dict[str, Any], arm: Arm) -> list[tuple[Any, ...]]:
    query = RecordQuery.of(
        filters.get("run_id", "run"),
        RECORD_FIELDS,
        filters.get("since"),
        filters.get("until"),
        filters.get("usable_only", False),
        filters.get("ended_since"),
        filters.get("ended_until"),
    )
    records = sorted(map(varied_record, range(N)), key=lambda r: r.t_start)
    return [tuple(r.to_dict().values()) for r in records if query.matches(r, arm)]


async def test_reads_return_the_stored_values_for_every_filter(sqlite_store: SqliteStore) -> None:
    for i in range(N):
        sqlite_store.record(varied_record(i))
    await sqlite_store.flush()
    for filters in FILTERS:
        kwargs = {"run_id": "run", **filters}
        got = await sqlite_store.read_records(columns=RECORD_FIELDS, **kwargs)
        for arm in ("speculative", "baseline"):
            assert got.get(arm, []) == _expected(filters, arm), (filters, arm)
            bools = [row[RECORD_FIELDS.index("shadow")] for row in got.get(arm, [])]
            assert all(type(b) is bool for b in bools)
    assert any(_expected(f, "baseline") for f in FILTERS)


async def test_query_walks_the_run_arm_time_index(sqlite_store: SqliteStore) -> None:
    for filters in FILTERS:
        query = RecordQuery.of(
            filters.get("run_id", "run"),
            ("t_start", "e2e_s", "shadow"),
            since=filters.get("since"),
            until=filters.get("until"),
            usable_only=filters.get("usable_only", False),
            ended_since=filters.get("ended_since"),
            ended_until=filters.get("ended_until"),
        )
        sql, params = records_sql(query, "sqlite")
        for key in ("since", "until", "ended_since", "ended_until"):
            assert (key in filters) == (len([p for p in params if p == filters.get(key)]) > 0)
        conn = sqlite3.connect(sqlite_store.path)
        try:
            plan = " | ".join(
                row[-1]
                for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", with_arm(params, "baseline"))
            )
        finally:
            conn.close()
        assert "SCAN" not in plan, plan
        if "ended_since" in filters:  # by the end's index, whatever the bound on the start
            assert "USING INDEX requests_run_arm_end (run_id=? AND arm=? AND <expr>>?" in plan
            continue
        assert "USING INDEX requests_run_arm_t (run_id=? AND arm=?" in plan, plan
        if "since" in filters or "until" in filters:
            assert "t_start>?" in plan or "t_start<?" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # ORDER BY t_start comes from the index


async def test_reads_during_continuous_writes_see_whole_batches(sqlite_store: SqliteStore) -> None:
    stop = asyncio.Event()

    async def write() -> int:
        i = 0
        while not stop.is_set():
            for _ in range(250):
                sqlite_store.record(make_record(i))
                i += 1
            await sqlite_store.flush()
        return i

    writer = asyncio.create_task(write())
    seen: list[int] = []
    for _ in range(5):
        records = await sqlite_store.read_records(run_id="run", columns=["request_id"])
        seen.append(sum(len(rows) for rows in records.values()))
        await asyncio.sleep(0.05)
    stop.set()
    total = await writer
    assert all(n % 250 == 0 for n in seen), seen  # one snapshot: whole transactions only
    assert seen == sorted(seen) and seen[-1] > 0
    records = await sqlite_store.read_records(run_id="run", columns=["request_id"])
    assert sum(len(rows) for rows in records.values()) == total
    assert sqlite_store.healthy and sqlite_store.pending == 0


async def test_read_only_start_opens_the_file_read_only(tmp_path: Path) -> None:
    """stats / report: a current store is opened with mode=ro, never written or migrated."""
    db = tmp_path / "ro.db"
    cfg = store_config(f"sqlite:///{db}", tmp_path)
    writer = open_store(cfg)
    await writer.start()
    for i in range(5):
        writer.record(make_record(i))
    await writer.flush()
    await writer.close()
    before = db.stat().st_mtime_ns
    reader = open_store(cfg)
    assert isinstance(reader, SqliteStore)
    await reader.start(read_only=True)
    try:
        records = await reader.read_records(run_id="run", columns=["request_id"])
        assert sum(len(rows) for rows in records.values()) == 5
        conn = reader._conn
        assert conn is not None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await reader._on_writer(conn.execute, "CREATE TABLE x (a)")
    finally:
        await reader.close()
    assert db.stat().st_mtime_ns == before


def _grow_and_checkpoint(conn: sqlite3.Connection, wal: Path) -> tuple[int, int, int]:
    """The WAL's size grown past a 64 KiB limit, after a PASSIVE checkpoint, and after the next
    write restarts it."""
    conn.execute("PRAGMA journal_size_limit=65536")  # a small limit, to see it act
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute("CREATE TABLE pad (x BLOB)")
    for _ in range(64):
        conn.execute("INSERT INTO pad VALUES (randomblob(16384))")
    grown = wal.stat().st_size
    conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()  # copies, never truncates
    checkpointed = wal.stat().st_size
    conn.execute("INSERT INTO pad VALUES (1)")  # restarts the WAL: truncated to the limit
    return grown, checkpointed, wal.stat().st_size


async def test_the_wal_shrinks_back_after_a_checkpoint(tmp_path: Path) -> None:
    """journal_size_limit: a WAL grown past the limit (a long outage's replay, a long read) is
    truncated back to it once a checkpoint lets it restart, not kept at its high-water mark."""
    store = open_store(store_config(f"sqlite:///{tmp_path}/store.db", tmp_path, batch_size=1000))
    assert isinstance(store, SqliteStore)
    await store.start()
    conn = store._connect()  # the store's own connection settings
    try:
        assert conn.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_SIZE_LIMIT_BYTES
        grown, checkpointed, restarted = _grow_and_checkpoint(conn, tmp_path / "store.db-wal")
    finally:
        conn.close()
        await store.close()
    assert grown > 4 * 65536 and checkpointed == grown
    assert restarted <= 65536


@pytest.mark.parametrize("n", [0, 1, 2, 6, 7, 8, 13, 20])
def test_insert_rows_writes_what_executemany_writes(
    n: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many rows a statement (the writer's GIL hand-offs), around every chunk boundary: the
    same table as one statement a row, upserts of a key twice in one batch included."""
    import specproxy.store.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_MAX_ROWS", 3)
    upsert = (
        "INSERT INTO t (k, v, m) VALUES (?, ?, ?) "
        "ON CONFLICT (k) DO UPDATE SET v = t.v + excluded.v, m = max(t.m, excluded.m)"
    )
    rows = [(i % 5, float(i), i * 7 % 11) for i in range(n)]  # keys repeat within the batch
    tables = []
    for write in (
        lambda c: c.executemany(upsert, rows),
        lambda c: sqlite_module.insert_rows(c, upsert, rows),
    ):
        conn = sqlite3.connect(":memory:")
        conn.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v REAL, m INTEGER)")
        conn.execute("INSERT INTO t VALUES (0, 100.0, 5)")  # a row already there
        write(conn)
        tables.append(conn.execute("SELECT * FROM t ORDER BY k").fetchall())
    assert tables[0] == tables[1]
    assert len(tables[1]) == (1 if n == 0 else min(n, 5))


def test_insert_rows_keeps_sqlites_parameter_bound() -> None:
    """Wide rows get fewer a statement: never more than SQLite's 999 parameters."""
    import specproxy.store.sqlite as sqlite_module

    width = 40
    sql = f"INSERT INTO w VALUES ({', '.join('?' * width)})"
    conn = sqlite3.connect(":memory:")
    conn.execute(f"CREATE TABLE w ({', '.join(f'c{i}' for i in range(width))})")
    conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, sqlite_module._MAX_PARAMS)
    sqlite_module.insert_rows(conn, sql, [tuple(range(i, i + width)) for i in range(100)])
    assert conn.execute("SELECT count(*), sum(c0) FROM w").fetchone() == (100, sum(range(100)))
