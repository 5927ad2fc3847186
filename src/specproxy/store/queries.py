"""The read queries of the SQL backends, written once for SQLite and PostgreSQL.

Each builder returns the SQL and its parameters. The text is written with `?` placeholders and
given to PostgreSQL (asyncpg) as `$1, $2, ...`; booleans and JSON are the only other differences
between the two dialects here.
"""

from __future__ import annotations

import math
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from specproxy.errors import StoreError
from specproxy.records import RECORD_FIELDS, Arm, RequestRecord
from specproxy.store.aggregates import ENGINE_HOURS, total_sql
from specproxy.store.enginehours import HOUR_S, aggregate_columns, first_hour_from
from specproxy.store.schema import (
    BOOL_COLUMNS,
    ENGINE_COLUMNS,
    GPU_COLUMNS,
    REQUEST_COLUMNS,
    Dialect,
)
from specproxy.summary.engine import EngineAggregate

__all__ = [
    "BOOL_CONVERTER",
    "MODELS_SQL",
    "RUN_IDS_SQL",
    "RecordQuery",
    "RestartPlan",
    "aggregate_queries",
    "arms_sql",
    "engine_aggregate_from",
    "engine_aggregate_sql",
    "engine_hours_sql",
    "engine_sql",
    "export_sql",
    "gpu_sql",
    "latest_stats_sql",
    "placeholders",
    "records_sql",
    "restart_neighbour_sql",
    "restart_plan",
    "restarted_sql",
    "stats_history_sql",
    "with_arm",
]

Query = tuple[str, tuple[Any, ...]]

# sqlite3 converter of booleans (0/1) to bool, by column name (`detect_types=PARSE_COLNAMES`)
BOOL_CONVERTER = "specproxy_bool"

MODELS_SQL = "SELECT DISTINCT model FROM requests WHERE run_id = ? ORDER BY model"
RUN_IDS_SQL = "SELECT DISTINCT run_id FROM requests ORDER BY 1"


ARM_TABLES = ("requests", "engine_samples", "gpu_samples")  # each indexed on (run_id, arm, ...)


def arms_sql(table: str, run_id: str, dialect: Dialect) -> Query:
    """The arm names of a run in `table`, in name order: one index probe per arm (a loose
    index scan of the (run_id, arm, ...) index), however many rows each arm has."""
    if table not in ARM_TABLES:
        raise ValueError(f"no arm index on {table!r}")
    sql = (
        "WITH RECURSIVE a(arm) AS ("
        f"SELECT MIN(arm) FROM {table} WHERE run_id = ? "
        f"UNION ALL SELECT (SELECT MIN(arm) FROM {table} WHERE run_id = ? AND arm > a.arm) "
        "FROM a WHERE a.arm IS NOT NULL"
        ") SELECT arm FROM a WHERE arm IS NOT NULL"
    )
    return placeholders(sql, dialect), (run_id, run_id)


def placeholders(sql: str, dialect: Dialect) -> str:
    """`?` placeholders as the dialect wants them: kept for SQLite, `$1, $2, ...` for PostgreSQL."""
    if dialect == "sqlite":
        return sql
    head, *rest = sql.split("?")
    return head + "".join(f"${i}{part}" for i, part in enumerate(rest, start=1))


@dataclass(frozen=True, slots=True)
class RecordQuery:
    """The arguments of `read_records`, checked (`of`): columns are spliced into SQL."""

    run_id: str
    columns: tuple[str, ...]  # record fields
    since: float | None = None  # since <= t_start
    until: float | None = None  # t_start < until
    usable_only: bool = False  # status 200, no error kind, not disconnected, not rerouted
    ended_since: float | None = None  # ended_since <= t_start + e2e_s (the request's end)
    ended_until: float | None = None  # t_start + e2e_s < ended_until

    @classmethod
    def of(
        cls,
        run_id: str,
        columns: Sequence[str],
        since: float | None = None,
        until: float | None = None,
        usable_only: bool = False,
        ended_since: float | None = None,
        ended_until: float | None = None,
    ) -> RecordQuery:
        """The query, or a `StoreError` for no column or a column that is no record field."""
        unknown = [c for c in columns if c not in RECORD_FIELDS]
        if unknown:
            raise StoreError(f"unknown record column(s): {', '.join(unknown)}")
        if not columns:
            raise StoreError("read_records needs at least one column")
        return cls(run_id, tuple(columns), since, until, usable_only, ended_since, ended_until)

    def matches(self, rec: RequestRecord, arm: Arm) -> bool:
        """Whether `rec` is one of the records of `arm` this query selects (the memory store)."""
        return (
            rec.run_id == self.run_id
            and rec.arm == arm
            and (self.since is None or rec.t_start >= self.since)
            and (self.until is None or rec.t_start < self.until)
            and (self.ended_since is None or rec.t_start + rec.e2e_s >= self.ended_since)
            and (self.ended_until is None or rec.t_start + rec.e2e_s < self.ended_until)
            and (not self.usable_only or rec.comparable)
        )


# A request's end, as the index of migration 12 spells it (the planner matches it verbatim).
ENDED = "t_start + e2e_s"


def records_sql(query: RecordQuery, dialect: Dialect) -> Query:
    """`read_records` for one arm, whose value is the second parameter and not in the returned
    ones (`with_arm` adds it). Every filter is in the WHERE clause, so the (run_id, arm, t_start)
    index does the work, or, with a bound on the end, the (run_id, arm, t_start + e2e_s) one
    (migration 12; the expression is written exactly as indexed; the few rows are then sorted).
    SQLite's booleans are named for `BOOL_CONVERTER`, which the SQLite store registers, so they
    come back as bool as in PostgreSQL."""
    where = ["run_id = ?", "arm = ?"]
    params: list[Any] = [query.run_id]
    for clause, value in (
        (f"{ENDED} >= ?", query.ended_since),
        (f"{ENDED} < ?", query.ended_until),
        ("t_start >= ?", query.since),
        ("t_start < ?", query.until),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    if query.usable_only:
        where.append("status = 200 AND error_kind IS NULL AND rerouted_from IS NULL")
        where.append("disconnected = 0" if dialect == "sqlite" else "NOT disconnected")
    columns = [
        f'{c} AS "{c} [{BOOL_CONVERTER}]"' if dialect == "sqlite" and c in BOOL_COLUMNS else c
        for c in query.columns
    ]
    table = "requests"
    if dialect == "sqlite" and (query.ended_since is not None or query.ended_until is not None):
        # SQLite would rather walk the t_start index for the ORDER BY, from `since` on: a step's
        # whole history, where the span of ends holds a tick's requests
        table += " INDEXED BY requests_run_arm_end"
    sql = f"SELECT {', '.join(columns)} FROM {table} WHERE {' AND '.join(where)} ORDER BY t_start"
    return placeholders(sql, dialect), tuple(params)


def with_arm(params: tuple[Any, ...], arm: Arm) -> tuple[Any, ...]:
    """The parameters of `records_sql` for `arm`."""
    return (params[0], arm, *params[1:])


def engine_sql(run_id: str, since: float | None, arm: Arm | None, dialect: Dialect) -> Query:
    """`read_engine_samples`: columns in `ENGINE_COLUMNS` order, time order."""
    where = ["run_id = ?"]
    params: list[Any] = [run_id]
    if since is not None:
        where.append("t >= ?")
        params.append(since)
    if arm is not None:
        where.append("arm = ?")
        params.append(arm)
    sql = (
        f"SELECT {', '.join(ENGINE_COLUMNS)} FROM engine_samples WHERE {' AND '.join(where)} "
        "ORDER BY t"
    )
    return placeholders(sql, dialect), tuple(params)


def engine_aggregate_sql(
    run_id: str, arm: Arm, since: float, dialect: Dialect, until: float | None = None
) -> Query:
    """The aggregate of one arm's samples with since <= t < until (-inf / None: unbounded):
    one row, `engine_aggregate_from` reads it. The (run_id, arm, t) key bounds the rows read."""
    where = "run_id = ? AND arm = ?"
    params: list[Any] = [run_id, arm]
    if since > -math.inf:
        where += " AND t >= ?"
        params.append(since)
    if until is not None:
        where += " AND t < ?"
        params.append(until)
    sql = f"SELECT {', '.join(aggregate_columns(dialect))} FROM engine_samples WHERE {where}"
    return placeholders(sql, dialect), tuple(params)


def engine_hours_sql(run_id: str, arm: Arm, from_hour: int | None, dialect: Dialect) -> Query:
    """The sum of one arm's `engine_hours` rows from `from_hour` (None: all), in the row shape
    of `engine_aggregate_sql`."""
    first = from_hour if from_hour is not None else -(2**62)
    sql = total_sql(ENGINE_HOURS, "run_id = ? AND arm = ? AND hour >= ?")
    return placeholders(sql, dialect), (run_id, arm, first)


def aggregate_queries(run_id: str, arm: Arm, since: float, dialect: Dialect) -> list[Query]:
    """`read_engine`'s aggregate of one arm and window start: the samples of [since, the next
    whole hour) and the hour rows from that hour (`store.enginehours`); merge their rows."""
    if since == -math.inf:
        return [engine_hours_sql(run_id, arm, None, dialect)]
    hour = first_hour_from(since)
    return [
        engine_aggregate_sql(run_id, arm, since, dialect, until=float(hour * HOUR_S)),
        engine_hours_sql(run_id, arm, hour, dialect),
    ]


def engine_aggregate_from(row: Sequence[Any]) -> EngineAggregate:
    """The row of `engine_aggregate_sql` (or `aggregates.total_sql` of `ENGINE_HOURS`) as an
    aggregate (sums of no rows are NULL)."""
    n, restarts, up, *means, max_k = row
    return EngineAggregate(
        samples=int(n or 0),
        restarts=int(restarts or 0),
        up_samples=int(up or 0),
        sums=tuple(float(v) if v is not None else 0.0 for v in means[0::2]),
        counts=tuple(int(c or 0) for c in means[1::2]),
        max_k=int(max_k) if max_k is not None else None,
    )


def restarted_sql(run_id: str, arm: Arm, dialect: Dialect) -> Query:
    """The up samples of `arm` marked restarted, in time order (`ENGINE_COLUMNS`)."""
    sql = (
        f"SELECT {', '.join(ENGINE_COLUMNS)} FROM engine_samples "
        "WHERE run_id = ? AND arm = ? AND restarted AND up ORDER BY t"
    )
    return placeholders(sql, dialect), (run_id, arm)


def restart_neighbour_sql(
    run_id: str, arm: Arm, *, up: bool, after: float, before: float, dialect: Dialect
) -> Query:
    """The one sample of `arm` with after < t < before that `summary.engine.restart_evidence` keeps:
    the latest up one (`up`) or the earliest failed one (not `up`); by the (run_id, arm, t)
    key, so it reads the samples between the two times at most."""
    sql = (
        f"SELECT {', '.join(ENGINE_COLUMNS)} FROM engine_samples "
        "WHERE run_id = ? AND arm = ? AND t > ? AND t < ? AND "
        + ("up ORDER BY t DESC" if up else "NOT up ORDER BY t")
        + " LIMIT 1"
    )
    return placeholders(sql, dialect), (run_id, arm, after, before)


RestartPlan = Generator[Query, Sequence[Sequence[Any]], list[Sequence[Any]]]


def restart_plan(run_id: str, dialect: Dialect) -> RestartPlan:
    """`read_engine`'s restart samples as queries: send each yielded query's rows back; returns
    the rows (`ENGINE_COLUMNS`) of `summary.engine.restart_evidence` of every arm, each arm in
    time order. Two key lookups per restart: the cost follows the restarts, not the run's
    length."""
    out: list[Sequence[Any]] = []
    arms = yield arms_sql("engine_samples", run_id, dialect)
    for (arm,) in arms:
        restarted = yield restarted_sql(run_id, arm, dialect)
        keep = {row[0]: row for row in restarted}  # by t, unique per (run, arm)
        for row in restarted:
            t = row[0]
            previous = yield restart_neighbour_sql(
                run_id, arm, up=True, after=-math.inf, before=t, dialect=dialect
            )
            after = -math.inf
            if previous:
                after = previous[0][0]
                keep[after] = previous[0]
            failed = yield restart_neighbour_sql(
                run_id, arm, up=False, after=after, before=t, dialect=dialect
            )
            if failed:
                keep[failed[0][0]] = failed[0]
        out.extend(keep[t] for t in sorted(keep))
    return out


def stats_history_sql(run_id: str, since: float | None, dialect: Dialect) -> Query:
    """`read_stats_history`: (t, result as JSON text), in the order written."""
    result = "result" if dialect == "sqlite" else "result::text AS result"
    sql = f"SELECT t, {result} FROM stats_history WHERE run_id = ?"
    params: list[Any] = [run_id]
    if since is not None:
        sql += " AND t >= ?"
        params.append(since)
    return placeholders(sql + " ORDER BY t, id", dialect), tuple(params)


def latest_stats_sql(run_id: str, newer_than: float | None, dialect: Dialect) -> Query:
    """`latest_stats`: the newest (t, result as JSON text) with t > newer_than, if any; by the
    (run_id, t) index."""
    result = "result" if dialect == "sqlite" else "result::text AS result"
    sql = f"SELECT t, {result} FROM stats_history WHERE run_id = ?"
    params: list[Any] = [run_id]
    if newer_than is not None:
        sql += " AND t > ?"
        params.append(newer_than)
    return placeholders(sql + " ORDER BY t DESC, id DESC LIMIT 1", dialect), tuple(params)


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
    params: list[Any] = [run_id, arm]
    if since is not None:
        sql += " AND t >= ?"
        params.append(since)
    sql += " ORDER BY t DESC"
    if limit is not None:
        sql += " LIMIT ?"
        params.append(limit)
    return placeholders(sql, dialect), tuple(params)
