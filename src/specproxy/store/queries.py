"""The read queries of the SQL backends, written once for SQLite and PostgreSQL.

Each builder returns the SQL and its parameters. The text is written with `?` placeholders and
given to PostgreSQL (asyncpg) as `$1, $2, ...`; booleans and JSON are the only other differences
between the two dialects here.
"""

from __future__ import annotations

from typing import Any

from specproxy.records import Arm
from specproxy.store.base import RecordQuery
from specproxy.store.schema import ENGINE_COLUMNS, GPU_COLUMNS, REQUEST_COLUMNS, Dialect

__all__ = [
    "MODELS_SQL",
    "RUN_IDS_SQL",
    "engine_sql",
    "export_sql",
    "gpu_sql",
    "placeholders",
    "records_sql",
    "stats_history_sql",
    "with_arm",
]

Query = tuple[str, tuple[Any, ...]]

MODELS_SQL = "SELECT DISTINCT model FROM requests WHERE run_id = ? ORDER BY model"
RUN_IDS_SQL = "SELECT DISTINCT run_id FROM requests ORDER BY 1"


def placeholders(sql: str, dialect: Dialect) -> str:
    """`?` placeholders as the dialect wants them: kept for SQLite, `$1, $2, ...` for PostgreSQL."""
    if dialect == "sqlite":
        return sql
    head, *rest = sql.split("?")
    return head + "".join(f"${i}{part}" for i, part in enumerate(rest, start=1))


def records_sql(query: RecordQuery, dialect: Dialect) -> Query:
    """`read_arrays` for one arm, whose value is the second parameter and not in the returned
    ones (`with_arm` adds it). Every filter is in the WHERE clause, so the (run_id, arm, t_start)
    index does the work."""
    where = ["run_id = ?", "arm = ?"]
    params: list[Any] = [query.run_id]
    for clause, value in (
        ("t_start >= ?", query.since),
        ("t_start < ?", query.until),
        ("model = ?", query.model),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    if not query.include_shadow:
        where.append("shadow = 0" if dialect == "sqlite" else "NOT shadow")
    sql = (
        f"SELECT {', '.join(query.columns)} FROM requests WHERE {' AND '.join(where)} "
        "ORDER BY t_start"
    )
    return placeholders(sql, dialect), tuple(params)


def with_arm(params: tuple[Any, ...], arm: Arm) -> tuple[Any, ...]:
    """The parameters of `records_sql` for `arm`."""
    return (params[0], arm.value, *params[1:])


def engine_sql(run_id: str, since: float | None, arm: Arm | None, dialect: Dialect) -> Query:
    """`read_engine_samples`: columns in `ENGINE_COLUMNS` order, time order."""
    where = ["run_id = ?"]
    params: list[Any] = [run_id]
    if since is not None:
        where.append("t >= ?")
        params.append(since)
    if arm is not None:
        where.append("arm = ?")
        params.append(arm.value)
    sql = (
        f"SELECT {', '.join(ENGINE_COLUMNS)} FROM engine_samples WHERE {' AND '.join(where)} "
        "ORDER BY t"
    )
    return placeholders(sql, dialect), tuple(params)


def stats_history_sql(run_id: str, since: float | None, dialect: Dialect) -> Query:
    """`read_stats_history`: (t, result as JSON text), in the order written."""
    result = "result" if dialect == "sqlite" else "result::text AS result"
    sql = f"SELECT t, {result} FROM stats_history WHERE run_id = ?"
    params: list[Any] = [run_id]
    if since is not None:
        sql += " AND t >= ?"
        params.append(since)
    return placeholders(sql + " ORDER BY t, id", dialect), tuple(params)


def export_sql(run_id: str | None, dialect: Dialect) -> Query:
    """`export_chunks`: every column of `REQUEST_COLUMNS`, in t_start order."""
    sql = f"SELECT {', '.join(REQUEST_COLUMNS)} FROM requests"
    params: tuple[Any, ...] = ()
    if run_id is not None:
        sql += " WHERE run_id = ?"
        params = (run_id,)
    return placeholders(sql + " ORDER BY t_start", dialect), params


def gpu_sql(
    run_id: str, arm: Arm, since: float | None, limit: int | None, dialect: Dialect
) -> Query:
    """`read_gpu_samples` of one arm: columns in `GPU_COLUMNS` order, NEWEST first (so that
    `limit` keeps the newest; the (run_id, arm, t) key serves it without a sort)."""
    sql = f"SELECT {', '.join(GPU_COLUMNS)} FROM gpu_samples WHERE run_id = ? AND arm = ?"
    params: list[Any] = [run_id, arm.value]
    if since is not None:
        sql += " AND t >= ?"
        params.append(since)
    sql += " ORDER BY t DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return placeholders(sql, dialect), tuple(params)
