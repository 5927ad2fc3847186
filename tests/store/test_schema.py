"""Migrations: a store created with the version-1 schema is upgraded at start-up, data intact."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg
import numpy as np

from specproxy.records import Arm, EngineSample
from specproxy.store.factory import open_store
from specproxy.store.schema import MIGRATIONS, REQUEST_COLUMNS, SCHEMA_VERSION
from tests.store.conftest import make_record, store_config

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
    old = await store.read_arrays(run_id="run", columns=["request_id", "ttft_s", "disconnected"])
    assert list(old[Arm.BASELINE]["request_id"]) == ["old-1"]
    assert old[Arm.BASELINE]["ttft_s"][0] == 0.3
    assert not old[Arm.BASELINE]["disconnected"][0]  # column added by v2, default false
    acc = await store.read_arrays(run_id="run", columns=["acceptance_rate", "engine_url"])
    assert np.isnan(acc[Arm.BASELINE]["acceptance_rate"][0])
    assert acc[Arm.BASELINE]["engine_url"][0] is None  # column added by v3
    store.record(make_record(1, acceptance_rate=0.5, disconnected=True, engine_url="http://e:1"))
    store.record_engine(
        EngineSample(t=6.0, run_id="run", arm=Arm.SPECULATIVE, up=True, position_acceptance=(0.5,))
    )
    await store.flush()
    await store.write_stats(run_id="run", t=1.0, result={"ok": 1})  # table added by v2
    new = await store.read_arrays(run_id="run", columns=REQUEST_COLUMNS)
    assert new[Arm.SPECULATIVE]["acceptance_rate"][0] == 0.5
    assert new[Arm.SPECULATIVE]["engine_url"][0] == "http://e:1"
    samples = await store.read_engine_samples(run_id="run")
    assert [s.position_acceptance for s in samples] == [None, (0.5,)]
    await store.close()
    assert store.dropped == 0


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
    conn = await asyncpg.connect(pg_url)
    try:
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_version")]
    finally:
        await conn.close()
    assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))


async def test_two_stores_migrating_at_once_apply_each_version_once(
    pg_url: str, tmp_path: Path
) -> None:
    import asyncio

    stores = [open_store(store_config(pg_url, tmp_path / str(i))) for i in range(3)]
    await asyncio.gather(*(s.start() for s in stores))
    conn = await asyncpg.connect(pg_url)
    try:
        versions = [r["version"] for r in await conn.fetch("SELECT version FROM schema_version")]
    finally:
        await conn.close()
    assert sorted(versions) == list(range(1, SCHEMA_VERSION + 1))
    await asyncio.gather(*(s.close() for s in stores))


def test_row_builders_follow_the_column_order() -> None:
    from specproxy.records import Arm, EngineSample, RequestRecord
    from specproxy.store.schema import ENGINE_COLUMNS, REQUEST_COLUMNS, engine_row, request_row

    rec = RequestRecord("q", "r", Arm.SPECULATIVE, 1.0, "m", "completions", True, 200, 0.5, 0.4)
    row = dict(zip(REQUEST_COLUMNS, request_row(rec), strict=True))
    assert row == {c: getattr(rec, c) if c != "arm" else "speculative" for c in REQUEST_COLUMNS}
    sample = EngineSample(2.0, "r", Arm.BASELINE, True, position_acceptance=(0.9, 0.5))
    lite = dict(zip(ENGINE_COLUMNS, engine_row(sample, "sqlite"), strict=True))
    pg = dict(zip(ENGINE_COLUMNS, engine_row(sample, "postgresql"), strict=True))
    assert lite["position_acceptance"] == "[0.9, 0.5]" and pg["position_acceptance"] == [0.9, 0.5]
    assert lite["arm"] == pg["arm"] == "baseline" and lite["t"] == 2.0
