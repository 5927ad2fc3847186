"""The additive aggregates' declarations (`store.aggregates`): the frozen migrations create exactly
the declared tables, and the derived upsert, cut and memory table merge rows alike."""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import asyncpg
import pytest

from specproxy.records import EngineSample
from specproxy.store.aggregates import (
    AGGREGATES,
    ENGINE_HOURS,
    AdditiveTable,
    Aggregate,
    Column,
    Inserted,
    RollupCut,
    create_table_sql,
    retention_sql,
    upsert_sql,
)
from specproxy.store.migrations import MIGRATIONS
from tests.store.pgcluster import PgCluster


def _sqlite_tables(conn: sqlite3.Connection) -> dict[str, Any]:
    """Each aggregate's columns (name, type, not null, key position) and whether it has a rowid."""
    out = {}
    for a in AGGREGATES:
        columns = conn.execute(f"PRAGMA table_info({a.table})").fetchall()
        (sql,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = ?", (a.table,)).fetchone()
        out[a.table] = ([c[1:4] + c[5:] for c in columns], sql.rstrip().endswith("WITHOUT ROWID"))
    return out


def test_the_frozen_sqlite_migrations_create_the_declared_tables() -> None:
    migrated, declared = sqlite3.connect(":memory:"), sqlite3.connect(":memory:")
    for migration in MIGRATIONS:
        for statement in migration.sqlite:
            migrated.execute(statement)
    for a in AGGREGATES:
        declared.execute(create_table_sql(a, "sqlite"))
    assert _sqlite_tables(migrated) == _sqlite_tables(declared)
    assert all(columns for columns, _rowid in _sqlite_tables(declared).values())


_PG_COLUMNS = """
SELECT table_name, column_name, ordinal_position, data_type, is_nullable
FROM information_schema.columns WHERE table_schema = 'public' AND table_name = ANY($1::text[])
ORDER BY table_name, ordinal_position
"""
_PG_KEYS = """
SELECT c.relname, a.attname, k.n
FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
CROSS JOIN LATERAL unnest(i.indkey) WITH ORDINALITY AS k(attnum, n)
JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
WHERE i.indisprimary AND c.relname = ANY($1::text[]) ORDER BY 1, 3
"""


async def _pg_tables(url: str, statements: list[str]) -> tuple[list[Any], list[Any]]:
    conn = await asyncpg.connect(url)
    try:
        for statement in statements:
            await conn.execute(statement)
        names = [a.table for a in AGGREGATES]
        columns = [tuple(r) for r in await conn.fetch(_PG_COLUMNS, names)]
        keys = [tuple(r) for r in await conn.fetch(_PG_KEYS, names)]
    finally:
        await conn.close()
    return columns, keys


async def test_the_frozen_postgres_migrations_create_the_declared_tables(
    pg_url: str, pg_cluster: PgCluster
) -> None:
    declared_url = pg_cluster.create_database("aggregates_declared")
    migrated = await _pg_tables(pg_url, [s for m in MIGRATIONS for s in m.postgresql])
    declared = await _pg_tables(
        declared_url, [create_table_sql(a, "postgresql") for a in AGGREGATES]
    )
    assert migrated == declared
    assert {row[0] for row in declared[0]} == {a.table for a in AGGREGATES}


def _value(column: Column, rng: random.Random) -> Any:
    if column.nullable and rng.random() < 0.3:
        return None
    if column.type == "text":
        return rng.choice(["a", "b"])
    if column.type == "real":
        return rng.choice([0.5, 1.25, -2.0, 3.75])
    return rng.randrange(0, 3)


def _random_rows(aggregate: Aggregate, n: int, seed: int) -> list[tuple[Any, ...]]:
    """Rows with few distinct keys, so most of them merge into rows already there."""
    rng = random.Random(seed)
    return [tuple(_value(c, rng) for c in aggregate.columns) for _ in range(n)]


@pytest.mark.parametrize("aggregate", AGGREGATES, ids=lambda a: a.table)
def test_sqlite_upserts_and_the_memory_table_merge_and_cut_alike(aggregate: Aggregate) -> None:
    conn = sqlite3.connect(":memory:")
    conn.execute(create_table_sql(aggregate, "sqlite"))
    table = AdditiveTable(aggregate)
    batches = [_random_rows(aggregate, 200, seed) for seed in range(3)]
    if aggregate.maxes:  # a max that is NULL then and a number now, and the reverse, and NULL twice
        template = batches[0][0][len(aggregate.keys) : -1]
        batches.append([(f"k{i}", "x", 9, *template, m) for i, m in enumerate((None, 2, None))])
        batches.append([(f"k{i}", "x", 9, *template, m) for i, m in enumerate((3, None, None))])
    for rows in batches:
        conn.executemany(upsert_sql(aggregate, "sqlite"), rows)
        table.add(rows)
    stored = sorted(conn.execute(f"SELECT * FROM {aggregate.table}").fetchall())
    assert stored == sorted(table.select(lambda key: True))
    if aggregate.maxes:
        assert [row[-1] for row in stored if row[0].startswith("k")] == [3, 2, None]
    if isinstance(aggregate.retention, RollupCut):
        cut = aggregate.retention.span  # rows of time 0 end there
        removed = sum(conn.execute(s, (cut,)).rowcount for s in retention_sql(aggregate, "sqlite"))
        assert removed == table.cut(cut) > 0
        stored = sorted(conn.execute(f"SELECT * FROM {aggregate.table}").fetchall())
        assert stored == sorted(table.select(lambda key: True))


def test_engine_hour_rows_are_in_the_declared_column_order() -> None:
    samples = [
        EngineSample(t=7200.5, run_id="r", arm="baseline", up=True, acceptance_rate=0.5),
        EngineSample(t=7201.0, run_id="r", arm="baseline", up=False, restarted=True),
    ]
    (row,) = ENGINE_HOURS.rows(Inserted(engine=samples))
    named = dict(zip(ENGINE_HOURS.column_names, row, strict=True))
    assert named["hour"] == 2 and named["n"] == 2 and named["restarts"] == 1
    assert named["up_samples"] == 1 and named["sum_acceptance_rate"] == 0.5
    assert named["n_acceptance_rate"] == 1 and named["max_k"] is None


def test_the_ddl_of_a_declaration() -> None:
    """What `create_table_sql` prints, to freeze into a migration."""
    assert create_table_sql(AGGREGATES[0], "postgresql") == (
        "CREATE TABLE IF NOT EXISTS rollup_minutes (\n"
        "    run_id TEXT NOT NULL,\n"
        "    metric TEXT NOT NULL,\n"
        "    minute BIGINT NOT NULL,\n"
        "    model TEXT NOT NULL,\n"
        "    arm TEXT NOT NULL,\n"
        "    n BIGINT NOT NULL,\n"
        "    total DOUBLE PRECISION NOT NULL,\n"
        "    total_sq DOUBLE PRECISION NOT NULL,\n"
        "    PRIMARY KEY (run_id, metric, minute, model, arm)\n"
        ")"
    )
