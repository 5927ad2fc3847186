"""Migrations: an old store (schema version 1 or 5) is upgraded at start-up, data intact."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import asyncpg
import numpy as np
import pytest

from specproxy.records import EngineSample, GpuSample, RequestRecord
from specproxy.store.factory import open_store
from specproxy.store.migrations import MIGRATIONS, SCHEMA_VERSION
from specproxy.store.queries import RecordQuery, records_sql, with_arm
from specproxy.store.schema import GPU_COLUMNS, REQUEST_COLUMNS, gpu_row, gpu_sample
from tests.store.conftest import make_record, store_config
from tests.store.helpers import read_arrays, read_rollups

# The version-1 schema as an old release wrote it, spelled out here independently of the code.
V1_SQLITE = """
CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL NOT NULL);
INSERT INTO schema_version VALUES (1, 0);
CREATE TABLE requests (
    request_id TEXT NOT NULL, run_id TEXT NOT NULL, arm TEXT NOT NULL, t_start REAL NOT NULL,
    model TEXT NOT NULL, endpoint TEXT NOT NULL, stream INTEGER NOT NULL, status INTEGER NOT NULL,
    e2e_s REAL NOT NULL, upstream_s REAL NOT NULL, ttft_s REAL, tpot_s REAL,
    prompt_tokens INTEGER, output_tokens INTEGER, n_events INTEGER NOT NULL DEFAULT 0,
    tokens_per_event REAL, mean_gap_s REAL, max_gap_s REAL, pair_id TEXT,
    shadow INTEGER NOT NULL DEFAULT 0, error_kind TEXT,
    PRIMARY KEY (run_id, request_id, arm, shadow));
CREATE TABLE engine_samples (
    t REAL NOT NULL, run_id TEXT NOT NULL, arm TEXT NOT NULL, up INTEGER NOT NULL,
    restarted INTEGER NOT NULL DEFAULT 0, acceptance_rate REAL, mean_acceptance_length REAL,
    requests_running REAL, requests_waiting REAL, kv_cache_usage REAL,
    generation_tokens_per_s REAL, PRIMARY KEY (run_id, arm, t));
INSERT INTO requests (request_id, run_id, arm, t_start, model, endpoint, stream, status, e2e_s,
    upstream_s, ttft_s) VALUES ('old-1', 'run', 'baseline', 5.0, 'tiny', 'completions', 1, 200,
    2.0, 1.9, 0.3);
INSERT INTO engine_samples (t, run_id, arm, up) VALUES (5.0, 'run', 'speculative', 1);
"""


def test_migrations_are_numbered_in_order() -> None:
    assert [m.version for m in MIGRATIONS] == list(range(1, SCHEMA_VERSION + 1))


async def _check_upgraded(url: str, tmp_path: Path) -> None:
    store = open_store(store_config(url, tmp_path))
    await store.start()
    old = await read_arrays(store, run_id="run", columns=["request_id", "ttft_s", "disconnected"])
    assert list(old["baseline"]["request_id"]) == ["old-1"]
    assert old["baseline"]["ttft_s"][0] == 0.3
    assert not old["baseline"]["disconnected"][0]  # column added by v2, default false
    acc = await read_arrays(store, run_id="run", columns=["acceptance_rate", "engine_url"])
    assert np.isnan(acc["baseline"]["acceptance_rate"][0])
    assert acc["baseline"]["engine_url"][0] is None  # column added by v3
    store.record(make_record(1, acceptance_rate=0.5, disconnected=True, engine_url="http://e:1"))
    store.record_engine(
        EngineSample(t=6.0, run_id="run", arm="speculative", up=True, position_acceptance=(0.5,))
    )
    await store.flush()
    await store.write_stats(run_id="run", t=1.0, result={"ok": 1})  # table added by v2
    new = await read_arrays(store, run_id="run", columns=REQUEST_COLUMNS)
    assert new["speculative"]["acceptance_rate"][0] == 0.5
    assert new["speculative"]["engine_url"][0] == "http://e:1"
    samples = await store.read_engine_samples(run_id="run")
    assert [s.position_acceptance for s in samples] == [None, (0.5,)]
    await store.close()
    assert store.dropped == 0


async def _pg_versions(url: str) -> list[int]:
    """The schema versions a PostgreSQL store recorded, in order (each once if applied once)."""
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch("SELECT version FROM schema_version ORDER BY 1")
    finally:
        await conn.close()
    return [r["version"] for r in rows]


async def test_sqlite_v1_store_is_upgraded(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    with sqlite3.connect(db) as conn:
        conn.executescript(V1_SQLITE)
    await _check_upgraded(f"sqlite:///{db}", tmp_path)
    with sqlite3.connect(db) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))


async def test_postgres_v1_store_is_upgraded(pg_url: str, tmp_path: Path) -> None:
    ddl = (
        V1_SQLITE.replace("REAL", "DOUBLE PRECISION")
        .replace("stream INTEGER", "stream BOOLEAN")
        .replace("shadow INTEGER NOT NULL DEFAULT 0", "shadow BOOLEAN NOT NULL DEFAULT FALSE")
        .replace("up INTEGER", "up BOOLEAN")
        .replace("restarted INTEGER NOT NULL DEFAULT 0", "restarted BOOLEAN NOT NULL DEFAULT FALSE")
        .replace("'completions', 1, 200", "'completions', TRUE, 200")
        .replace("'speculative', 1)", "'speculative', TRUE)")
    )
    conn = await asyncpg.connect(pg_url)
    try:
        await conn.execute(ddl)
    finally:
        await conn.close()
    await _check_upgraded(pg_url, tmp_path)
    assert await _pg_versions(pg_url) == list(range(1, SCHEMA_VERSION + 1))


async def test_two_stores_migrating_at_once_apply_each_version_once(
    pg_url: str, tmp_path: Path
) -> None:
    import asyncio

    stores = [open_store(store_config(pg_url, tmp_path / str(i))) for i in range(3)]
    await asyncio.gather(*(s.start() for s in stores))
    assert await _pg_versions(pg_url) == list(range(1, SCHEMA_VERSION + 1))
    await asyncio.gather(*(s.close() for s in stores))


def test_row_builders_follow_the_column_order() -> None:
    from specproxy.records import EngineSample, RequestRecord
    from specproxy.store.schema import ENGINE_COLUMNS, REQUEST_COLUMNS, engine_row, request_row

    rec = RequestRecord("q", "r", "speculative", 1.0, "m", "completions", True, 200, 0.5, 0.4)
    row = dict(zip(REQUEST_COLUMNS, request_row(rec), strict=True))
    assert row == {c: getattr(rec, c) if c != "arm" else "speculative" for c in REQUEST_COLUMNS}
    sample = EngineSample(2.0, "r", "baseline", True, position_acceptance=(0.9, 0.5))
    lite = dict(zip(ENGINE_COLUMNS, engine_row(sample, "sqlite"), strict=True))
    pg = dict(zip(ENGINE_COLUMNS, engine_row(sample, "postgresql"), strict=True))
    assert lite["position_acceptance"] == "[0.9, 0.5]" and pg["position_acceptance"] == [0.9, 0.5]
    assert lite["arm"] == pg["arm"] == "baseline" and lite["t"] == 2.0


def _sqlite_store_at(db: Path, version: int, rows: list[str]) -> None:
    """A SQLite store as a release at schema `version` created it (the frozen migrations up to
    it), holding `rows` (INSERT statements)."""
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at REAL)")
        for migration in MIGRATIONS[:version]:
            for statement in migration.sqlite:
                conn.execute(statement)
            conn.execute("INSERT INTO schema_version VALUES (?, 0)", (migration.version,))
        for statement in rows:
            conn.execute(statement)


async def _pg_store_at(url: str, version: int, rows: list[str]) -> None:
    """`_sqlite_store_at` for PostgreSQL."""
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(
            "CREATE TABLE schema_version (version INTEGER PRIMARY KEY, "
            "applied_at DOUBLE PRECISION NOT NULL)"
        )
        for migration in MIGRATIONS[:version]:
            for statement in migration.postgresql:
                await conn.execute(statement)
            await conn.execute("INSERT INTO schema_version VALUES ($1, 0)", migration.version)
        for statement in rows:
            await conn.execute(statement)
    finally:
        await conn.close()


# Rows a version-5 store holds (requests, an engine sample, a stats row, a fine rollup minute).
V5_ROWS = (
    "INSERT INTO requests (request_id, run_id, arm, t_start, model, endpoint, stream, status, "
    "e2e_s, upstream_s, engine_url) VALUES ('v5-1', 'run', 'baseline', 7.0, 'tiny', "
    "'completions', {true}, 200, 2.5, 2.4, 'http://e:1')",
    "INSERT INTO engine_samples (t, run_id, arm, up) VALUES (7.0, 'run', 'speculative', {true})",
    "INSERT INTO stats_history (run_id, t, result) VALUES ('run', 7.0, '{{\"v\": 5}}')",
    "INSERT INTO rollup_minutes (run_id, metric, minute, model, arm, n, total, total_sq) "
    "VALUES ('run', 'e2e', 0, 'tiny', 'baseline', 1, 2.5, 6.25)",
)


async def _check_v5_upgraded(url: str, tmp_path: Path) -> None:
    store = open_store(store_config(url, tmp_path))
    await store.start()
    kept = await read_arrays(store, run_id="run", columns=["request_id", "e2e_s", "engine_url"])
    assert list(kept["baseline"]["request_id"]) == ["v5-1"]
    assert kept["baseline"]["engine_url"][0] == "http://e:1"
    assert [s.t for s in await store.read_engine_samples(run_id="run")] == [7.0]
    assert await store.read_stats_history(run_id="run") == [(7.0, {"v": 5})]
    rollups = await read_rollups(store, run_id="run", metric="e2e", until_minute=1)
    assert rollups["baseline"].n.tolist() == [1]
    assert await store.read_gpu_samples(run_id="run") == {}  # the new table starts empty
    sample = GpuSample(t=8.0, arm="speculative", up=True, run_id="run", memory_bandwidth=0.9)
    store.record_gpu(sample)
    await store.flush()
    assert await store.read_gpu_samples(run_id="run") == {"speculative": [sample]}
    await store.close()
    assert store.dropped == 0


async def test_sqlite_v5_store_gains_gpu_samples_and_keeps_its_data(tmp_path: Path) -> None:
    db = tmp_path / "v5.db"
    _sqlite_store_at(db, 5, [statement.format(true=1) for statement in V5_ROWS])
    await _check_v5_upgraded(f"sqlite:///{db}", tmp_path)
    with sqlite3.connect(db) as conn:
        versions = [v for (v,) in conn.execute("SELECT version FROM schema_version ORDER BY 1")]
    assert versions == list(range(1, SCHEMA_VERSION + 1))


async def test_postgres_v5_store_gains_gpu_samples_and_keeps_its_data(
    pg_url: str, tmp_path: Path
) -> None:
    await _pg_store_at(pg_url, 5, [statement.format(true="TRUE") for statement in V5_ROWS])
    await _check_v5_upgraded(pg_url, tmp_path)
    assert await _pg_versions(pg_url) == list(range(1, SCHEMA_VERSION + 1))


def test_gpu_row_and_its_reading_are_inverse() -> None:
    samples = [
        GpuSample(t=1.0, arm="baseline", up=True, run_id="r", clock_reasons=None),
        GpuSample(t=2.0, arm="baseline", up=True, run_id="r", clock_reasons=()),
        GpuSample(
            t=3.0,
            arm="speculative",
            up=True,
            run_id="r",
            thermal_throttled=False,
            clock_reasons=("hw_slowdown", "sw_thermal"),
            bandwidth_source="mem_copy_util",
        ),
        GpuSample(t=4.0, arm="speculative", up=False, run_id="r", error="timed out"),
    ]
    rows = [gpu_row(s) for s in samples]
    assert [dict(zip(GPU_COLUMNS, r, strict=True))["clock_reasons"] for r in rows] == [
        None,
        "",
        "hw_slowdown,sw_thermal",
        None,
    ]
    assert [gpu_sample(r) for r in rows] == samples
    # SQLite hands booleans back as 0/1
    assert gpu_sample(tuple(int(v) if isinstance(v, bool) else v for v in rows[2])) == samples[2]


# Engine samples a version-6 store holds: two hours of both arms, a restart after failed scrapes,
# unreported fields and per-position acceptance ({pos}: a dialect's list of 3).
V6_ENGINE_ROWS = tuple(
    "INSERT INTO engine_samples (t, run_id, arm, up, restarted, acceptance_rate, "
    "kv_cache_usage, position_acceptance, process_start_time) VALUES "
    f"({t}, 'run', '{arm}', {{{up}}}, {{{restarted}}}, {rate}, {kv}, {pos}, {start})"
    for t, arm, up, restarted, rate, kv, pos, start in (
        (3590.0, "speculative", "true", "false", 0.5, 0.25, "{pos}", 100.0),
        (3595.0, "speculative", "false", "false", "NULL", "NULL", "NULL", "NULL"),
        (3600.0, "speculative", "false", "false", "NULL", "NULL", "NULL", "NULL"),
        (3605.0, "speculative", "true", "true", 0.75, 0.5, "NULL", 3597.0),
        (7300.0, "speculative", "true", "false", "NULL", 1.0, "{pos}", 3597.0),
        (3600.0, "baseline", "true", "false", "NULL", 0.125, "NULL", 50.0),
    )
)


async def _check_v6_upgraded(url: str, tmp_path: Path) -> None:
    """The v7 hour aggregates are filled from the samples a v6 store held (and then kept up to
    date by writes): every window's summary and the restarts read as from the samples."""
    from specproxy.stats.diagnosis import summarise_aggregate, summarise_engine
    from specproxy.stats.warmup import restart_times
    from specproxy.summary.engine import MEAN_FIELDS

    store = open_store(store_config(url, tmp_path))
    await store.start()
    store.record_engine(EngineSample(t=7305.0, run_id="run", arm="baseline", up=True))
    await store.flush()
    samples = await store.read_engine_samples(run_id="run")
    assert len(samples) == 7
    starts = [-math.inf, 3595.0, 3600.0, 7300.0]
    view = await store.read_engine(run_id="run", since=starts)
    aggregates = view.aggregates
    for arm in ("speculative", "baseline"):
        for start in starts:
            want = summarise_engine([s for s in samples if s.arm == arm and s.t >= start])
            assert summarise_aggregate(aggregates[start][arm]) == want, (arm, start)
        assert restart_times(view.restart_samples, arm) == restart_times(samples, arm)
    assert restart_times(samples, "speculative") == [3597.0]  # its start, after 3595 failed
    assert MEAN_FIELDS[0] == "acceptance_rate"
    assert summarise_aggregate(aggregates[-math.inf]["speculative"]).acceptance_rate == 0.625
    assert summarise_aggregate(aggregates[-math.inf]["speculative"]).num_speculative_tokens == 3
    await store.close()
    assert store.dropped == 0


async def test_sqlite_v6_store_gains_hour_aggregates_of_its_samples(tmp_path: Path) -> None:
    db = tmp_path / "v6.db"
    rows = [r.format(true=1, false=0, pos="'[0.9, 0.5, 0.2]'") for r in V6_ENGINE_ROWS]
    _sqlite_store_at(db, 6, rows)
    await _check_v6_upgraded(f"sqlite:///{db}", tmp_path)


async def test_postgres_v6_store_gains_hour_aggregates_of_its_samples(
    pg_url: str, tmp_path: Path
) -> None:
    rows = [
        r.format(true="TRUE", false="FALSE", pos="ARRAY[0.9, 0.5, 0.2]") for r in V6_ENGINE_ROWS
    ]
    await _pg_store_at(pg_url, 6, rows)
    await _check_v6_upgraded(pg_url, tmp_path)
    assert await _pg_versions(pg_url) == list(range(1, SCHEMA_VERSION + 1))


async def _check_v7_upgraded(url: str, tmp_path: Path) -> None:
    """A v7 store keeps its rollups and starts the v8 moment tables empty; writes fill them."""
    store = open_store(store_config(url, tmp_path))
    await store.start()
    rollups = await read_rollups(store, run_id="run", metric="e2e", until_minute=1)
    assert rollups["baseline"].n.tolist() == [1]
    empty = await store.read_moments(run_id="run", since_minute=0)
    assert empty.hours == [] and empty.minutes == []
    store.record(
        RequestRecord(
            request_id="v8-1",
            run_id="run",
            arm="baseline",
            t_start=130.0,
            model="tiny",
            endpoint="completions",
            stream=True,
            status=200,
            e2e_s=2.0,
            upstream_s=1.9,
            prompt_tokens=8,
            output_tokens=16,
        )
    )
    await store.flush()
    got = await store.read_moments(run_id="run", since_minute=0)
    assert [r[:4] for r in got.minutes] == [(2, "tiny", "baseline", 1)]
    assert [r[:4] for r in got.hours] == [(0, "tiny", "baseline", 1)]
    assert got.minutes[0][4:] == pytest.approx(got.hours[0][4:])
    await store.close()
    assert store.dropped == 0


async def test_sqlite_v7_store_gains_empty_moment_tables(tmp_path: Path) -> None:
    db = tmp_path / "v7.db"
    _sqlite_store_at(db, 7, [statement.format(true=1) for statement in V5_ROWS])
    await _check_v7_upgraded(f"sqlite:///{db}", tmp_path)


async def test_postgres_v7_store_gains_empty_moment_tables(pg_url: str, tmp_path: Path) -> None:
    await _pg_store_at(pg_url, 7, [statement.format(true="TRUE") for statement in V5_ROWS])
    await _check_v7_upgraded(pg_url, tmp_path)
    assert await _pg_versions(pg_url) == list(range(1, SCHEMA_VERSION + 1))


async def _check_v8_upgraded(url: str, tmp_path: Path) -> None:
    """A v8 store keeps its rollups and gains the empty arm-event table of v9."""
    from specproxy.control.events import ArmEvent

    store = open_store(store_config(url, tmp_path))
    await store.start()
    rollups = await read_rollups(store, run_id="run", metric="e2e", until_minute=1)
    assert rollups["baseline"].n.tolist() == [1]
    assert await store.arm_events(run_id="run") == []
    added = await store.add_arm_event(ArmEvent("run", 1.0, "pause", "speculative"))
    assert await store.arm_events(run_id="run") == [added]
    await store.close()
    assert store.dropped == 0


async def _check_v8_rerouted(url: str, tmp_path: Path) -> None:
    """A v8 store's rows read as not rerouted; a rerouted record is stored with its flag, read
    back by every column, and left out of the usable rows and the rollups."""
    import dataclasses

    from specproxy.records import RerouteReason

    store = open_store(store_config(url, tmp_path))
    await store.start()
    old = await read_arrays(store, run_id="run", columns=["request_id", "rerouted_from"])
    assert list(old["baseline"]["request_id"]) == ["v5-1"]
    assert old["baseline"]["rerouted_from"][0] is None  # column added by v10
    served = make_record(1, arm="baseline", request_id="v9-1", t_start=130.0)
    store.record(served)
    store.record(
        dataclasses.replace(
            served,
            request_id="v9-2",
            t_start=131.0,
            rerouted_from="speculative",
            reroute_reason=RerouteReason.DOWN,
        )
    )
    await store.flush()
    got = await read_arrays(
        store, run_id="run", columns=["request_id", "rerouted_from", "reroute_reason"]
    )
    assert list(got["baseline"]["request_id"]) == ["v5-1", "v9-1", "v9-2"]
    assert list(got["baseline"]["rerouted_from"]) == [None, None, "speculative"]
    assert list(got["baseline"]["reroute_reason"]) == [None, None, "down"]
    usable = await store.read_records(run_id="run", columns=["request_id"], usable_only=True)
    assert [r[0] for r in usable["baseline"]] == ["v5-1", "v9-1"]
    rollups = await read_rollups(store, run_id="run", metric="e2e", until_minute=3)
    assert rollups["baseline"].n.tolist() == [1, 1]  # minute 0 (v5-1) and 2 (v9-1 only)
    await store.close()
    assert store.dropped == 0


async def test_sqlite_v8_store_gains_the_arm_event_table(tmp_path: Path) -> None:
    db = tmp_path / "v8.db"
    _sqlite_store_at(db, 8, [statement.format(true=1) for statement in V5_ROWS])
    await _check_v8_upgraded(f"sqlite:///{db}", tmp_path)


async def test_postgres_v8_store_gains_the_arm_event_table(pg_url: str, tmp_path: Path) -> None:
    await _pg_store_at(pg_url, 8, [statement.format(true="TRUE") for statement in V5_ROWS])
    await _check_v8_upgraded(pg_url, tmp_path)
    assert await _pg_versions(pg_url) == list(range(1, SCHEMA_VERSION + 1))


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_a_v8_store_gains_the_reroute_columns(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rows = V5_ROWS
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path / 'v8.db'}"
        _sqlite_store_at(tmp_path / "v8.db", 8, [r.format(true=1) for r in rows])
    else:
        url = request.getfixturevalue("pg_url")
        await _pg_store_at(url, 8, [r.format(true="TRUE") for r in rows])
    await _check_v8_rerouted(url, tmp_path)
    if dialect == "postgresql":
        assert await _pg_versions(url) == list(range(1, SCHEMA_VERSION + 1))


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql"])
async def test_a_v11_store_gains_the_index_of_request_ends(
    dialect: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    rows = [r.format(true=1 if dialect == "sqlite" else "TRUE") for r in V5_ROWS]
    if dialect == "sqlite":
        url = f"sqlite:///{tmp_path / 'v11.db'}"
        _sqlite_store_at(tmp_path / "v11.db", 11, rows)
    else:
        url = request.getfixturevalue("pg_url")
        await _pg_store_at(url, 11, rows)
    store = open_store(store_config(url, tmp_path))
    await store.start()
    for i in range(4000):  # enough rows that the planner's choice means something
        store.record(make_record(i, t_start=100.0 + i, e2e_s=2.0))
    await store.flush()
    got = await store.read_records(
        run_id="run", columns=["request_id"], ended_since=9.0, ended_until=10.0
    )
    assert got["baseline"] == [("v5-1",)]  # the old row (7.0 + 2.5) is found by its end
    await store.close()
    query = RecordQuery.of("run", ("t_start",), since=0.0, ended_since=600.0, ended_until=620.0)
    sql, params = records_sql(query, dialect)  # type: ignore[arg-type]
    if dialect == "sqlite":
        with sqlite3.connect(tmp_path / "v11.db") as lite:
            lite.execute("ANALYZE")
            plan = str(lite.execute(f"EXPLAIN QUERY PLAN {sql}", with_arm(params, "x")).fetchall())
    else:
        pg = await asyncpg.connect(url)
        try:
            await pg.execute("ANALYZE requests")
            plan = str(await pg.fetch(f"EXPLAIN {sql}", *with_arm(params, "baseline")))
        finally:
            await pg.close()
        assert await _pg_versions(url) == list(range(1, SCHEMA_VERSION + 1))
    # a tick's read walks the span of ends in the index, not the requests since the step began
    assert "requests_run_arm_end" in plan and "Seq Scan" not in plan, plan
