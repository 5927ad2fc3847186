"""SQLite reads: the ADBC (Arrow) path and the sqlite3 fallback give identical arrays, use the
(run_id, arm, t_start) index, and run beside the writer thread under WAL."""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specproxy.errors import ErrorKind
from specproxy.records import RECORD_FIELDS, Arm
from specproxy.store.base import ArmArrays, RecordQuery
from specproxy.store.factory import open_store
from specproxy.store.sqlite import (
    SqliteStore,
    adbc_available,
    arm_query,
    read_arms_sqlite3,
)
from tests.store.conftest import make_record, store_config

T0 = 1_700_000_000.0
N = 3000  # more than one of the driver's default 1024-row batches


@pytest.fixture
async def sqlite_store(tmp_path: Path) -> AsyncIterator[SqliteStore]:
    store = open_store(store_config(f"sqlite:///{tmp_path}/store.db", tmp_path, batch_size=1000))
    assert isinstance(store, SqliteStore)
    await store.start()
    yield store
    await store.close()
    assert store.dropped == 0


def varied_record(i: int) -> Any:
    """Leading runs of NULL (ttft, acceptance, pair_id, error) longer than one driver batch, so a
    reader that types columns from the first batch would see int64 and then a float or a string."""
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


def assert_same(a: dict[Arm, ArmArrays], b: dict[Arm, ArmArrays]) -> None:
    assert a.keys() == b.keys()
    for arm in a:
        assert a[arm].keys() == b[arm].keys()
        for name, left in a[arm].items():
            right = b[arm][name]
            assert left.dtype == right.dtype, name
            assert left.flags.writeable and right.flags.writeable, name
            if left.dtype == np.float64:
                np.testing.assert_array_equal(left, right, err_msg=name)  # NaN == NaN here
            else:
                assert left.tolist() == right.tolist(), name


FILTERS: list[dict[str, Any]] = [
    {},
    {"since": T0 + 600.0},
    {"until": T0 + 1200.0},
    {"since": T0 + 100.25, "until": T0 + 1300.0},
    {"model": "b"},
    {"include_shadow": False},
    {"since": T0 + 1000.0, "model": "a", "include_shadow": False},
    {"since": T0 + 1e6},  # nothing in the window
    {"run_id": "other"},
    {"run_id": "missing"},
]


@pytest.mark.skipif(not adbc_available(), reason="adbc-driver-sqlite not installed")
async def test_adbc_and_sqlite3_paths_return_identical_arrays(sqlite_store: SqliteStore) -> None:
    for i in range(N):
        sqlite_store.record(varied_record(i))
    await sqlite_store.flush()
    for filters in FILTERS:
        kwargs = {"run_id": "run", **filters}
        sqlite_store.array_reader = "adbc"
        via_adbc = await sqlite_store.read_arrays(columns=RECORD_FIELDS, **kwargs)
        sqlite_store.array_reader = "sqlite3"
        via_sqlite3 = await sqlite_store.read_arrays(columns=RECORD_FIELDS, **kwargs)
        assert_same(via_adbc, via_sqlite3)
    sqlite_store.array_reader = "adbc"
    every = await sqlite_store.read_arrays(run_id="run", columns=RECORD_FIELDS)
    base = every[Arm.BASELINE]
    expected = [
        r for r in map(varied_record, range(N)) if r.run_id == "run" and r.arm == "baseline"
    ]
    assert len(base["t_start"]) == len(expected)
    assert np.isnan(base["ttft_s"][0]) and base["ttft_s"][-1] == expected[-1].ttft_s
    assert base["shadow"].dtype == np.bool_ and base["shadow"].tolist() == [
        r.shadow for r in expected
    ]
    assert base["pair_id"][0] is None and base["pair_id"][-1] == expected[-1].pair_id
    assert base["status"].tolist() == [float(r.status) for r in expected]
    assert bool(np.all(np.diff(base["t_start"]) > 0))


@pytest.mark.skipif(not adbc_available(), reason="adbc-driver-sqlite not installed")
async def test_window_filters_pick_the_right_rows(sqlite_store: SqliteStore) -> None:
    for i in range(N):
        sqlite_store.record(varied_record(i))
    await sqlite_store.flush()
    got = await sqlite_store.read_arrays(
        run_id="run",
        columns=["request_id", "t_start"],
        since=T0 + 100.0,
        until=T0 + 200.0,
        model="a",
        include_shadow=False,
    )
    want = {
        arm: [
            r.request_id
            for r in map(varied_record, range(N))
            if r.arm == arm and r.run_id == "run" and r.model == "a" and not r.shadow
            if T0 + 100.0 <= r.t_start < T0 + 200.0
        ]
        for arm in Arm
    }
    assert {arm: got[arm]["request_id"].tolist() for arm in Arm} == want
    assert all(want.values())


async def test_query_walks_the_run_arm_time_index(sqlite_store: SqliteStore) -> None:
    for filters in FILTERS:
        query = arm_query(
            RecordQuery(
                filters.get("run_id", "run"),
                ("t_start", "e2e_s"),
                since=filters.get("since"),
                until=filters.get("until"),
                model=filters.get("model"),
                include_shadow=filters.get("include_shadow", True),
            )
        )
        for key in ("since", "until", "model"):
            assert (key in filters) == (len([p for p in query.params if p == filters.get(key)]) > 0)
        conn = sqlite3.connect(sqlite_store.path)
        try:
            plan = " | ".join(
                row[-1]
                for row in conn.execute(
                    f"EXPLAIN QUERY PLAN {query.sql}", query.arm_params(Arm.BASELINE)
                )
            )
        finally:
            conn.close()
        assert "USING INDEX requests_run_arm_t (run_id=? AND arm=?" in plan, plan
        if "since" in filters or "until" in filters:
            assert "t_start>?" in plan or "t_start<?" in plan, plan
        assert "TEMP B-TREE" not in plan, plan  # ORDER BY t_start comes from the index
        assert "SCAN" not in plan, plan


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
    for reader in (
        ("adbc", "sqlite3", "adbc", "sqlite3", "adbc") if adbc_available() else ["sqlite3"]
    ):
        sqlite_store.array_reader = reader
        arrays = await sqlite_store.read_arrays(run_id="run", columns=["request_id"])
        seen.append(sum(len(a["request_id"]) for a in arrays.values()))
        await asyncio.sleep(0.05)
    stop.set()
    total = await writer
    assert all(n % 250 == 0 for n in seen), seen  # one snapshot: whole transactions only
    assert seen == sorted(seen) and seen[-1] > 0
    arrays = await sqlite_store.read_arrays(run_id="run", columns=["request_id"])
    assert sum(len(a["request_id"]) for a in arrays.values()) == total
    assert sqlite_store.healthy and sqlite_store.pending == 0


async def test_adbc_reads_leave_the_wal_usable_for_new_connections(
    sqlite_store: SqliteStore,
) -> None:
    """The reason ADBC runs in its own process: in this one it would reset the WAL index."""
    for round_ in range(3):
        for i in range(round_ * 100, (round_ + 1) * 100):
            sqlite_store.record(make_record(i))
        await sqlite_store.flush()
        sqlite_store.array_reader = "adbc"
        arrays = await sqlite_store.read_arrays(run_id="run", columns=["request_id"])
        assert sum(len(a["request_id"]) for a in arrays.values()) == (round_ + 1) * 100
    assert await asyncio.to_thread(os.path.exists, f"{sqlite_store.path}-wal")  # not unlinked
    conn = sqlite3.connect(sqlite_store.path)
    try:
        assert conn.execute("SELECT COUNT(*) FROM requests").fetchone() == (300,)
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    finally:
        conn.close()


async def test_a_failing_adbc_read_falls_back_to_sqlite3(
    sqlite_store: SqliteStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(*args: object) -> None:
        raise OSError("[SQLite] Type mismatch in column 0: expected INT64 but got DOUBLE")

    monkeypatch.setattr(sqlite_store, "_read_arrays_adbc", broken)
    for i in range(10):
        sqlite_store.record(make_record(i))
    await sqlite_store.flush()
    sqlite_store.array_reader = "adbc"
    arrays = await sqlite_store.read_arrays(run_id="run", columns=["request_id", "e2e_s"])
    assert arrays[Arm.BASELINE]["request_id"].tolist() == [f"req-{i}" for i in range(0, 10, 2)]


def test_without_the_adbc_driver_reads_use_sqlite3(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "adbc_driver_sqlite.dbapi", None)  # import fails
    assert not adbc_available()
    store = open_store(store_config(f"sqlite:///{tmp_path}/s.db", tmp_path))
    assert isinstance(store, SqliteStore) and store.array_reader == "sqlite3"


def test_sqlite3_reader_uses_one_snapshot_for_both_arms(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db")
    conn.execute("CREATE TABLE requests (run_id, arm, t_start, e2e_s)")
    conn.execute("INSERT INTO requests VALUES ('r', 'baseline', 1.0, NULL)")
    conn.commit()
    query = arm_query(RecordQuery("r", ("t_start", "e2e_s")))
    out = read_arms_sqlite3(conn, query)
    assert not conn.in_transaction
    assert out[Arm.BASELINE]["t_start"].tolist() == [1.0]
    assert np.isnan(out[Arm.BASELINE]["e2e_s"][0]) and len(out[Arm.SPECULATIVE]["e2e_s"]) == 0
    conn.close()


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
    reader.array_reader = "sqlite3"
    await reader.start(read_only=True)
    try:
        arrays = await reader.read_arrays(run_id="run", columns=["request_id"])
        assert sum(len(a["request_id"]) for a in arrays.values()) == 5
        conn = reader._conn
        assert conn is not None
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            await reader._on_writer(conn.execute, "CREATE TABLE x (a)")
    finally:
        await reader.close()
    assert db.stat().st_mtime_ns == before
