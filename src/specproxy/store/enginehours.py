"""The engine samples' hours (`aggregates.ENGINE_HOURS`): their rows, and their SQL over samples.

Every write adds the samples it inserted into one row per (run, arm, hour) holding the fields of
`EngineAggregate` (`hour_rows`, in that order). A window from `since` then reads the samples of
[since, the next whole hour) (`aggregate_columns`) and the hour rows from that hour: at most an
hour of samples plus a row per hour, exactly the samples of the window (hours split on exact
boundaries, `hour_of`). Retention deletes the hours up to the cut-off's and rebuilds that hour
from the samples it keeps (`rebuild_hour_sql`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from specproxy.records import EngineSample
from specproxy.summary.engine import MEAN_FIELDS, aggregate_samples

__all__ = [
    "HOUR_S",
    "aggregate_columns",
    "first_hour_from",
    "hour_of",
    "hour_rows",
    "rebuild_hour_sql",
]

HOUR_S = 3600


def hour_of(t: float) -> int:
    """The hour h with h * 3600 <= t < (h + 1) * 3600, exactly (no rounding of t / 3600)."""
    h = math.floor(t / HOUR_S)
    if t < h * HOUR_S:
        return h - 1
    if t >= (h + 1) * HOUR_S:
        return h + 1
    return h


def first_hour_from(since: float) -> int:
    """The first hour h with h * 3600 >= since: a window from `since` is the samples of
    [since, h * 3600) plus the hour rows from h."""
    h = hour_of(since)
    return h if h * HOUR_S >= since else h + 1


def hour_rows(samples: Iterable[EngineSample]) -> list[tuple[Any, ...]]:
    """Newly inserted samples as rows to add, one per (run, arm, hour): the key, then the fields
    of their `EngineAggregate` (samples, restarts, up samples, sum and count of each mean field,
    max k)."""
    groups: dict[tuple[str, str, int], list[EngineSample]] = {}
    for s in samples:
        groups.setdefault((s.run_id, s.arm, hour_of(s.t)), []).append(s)
    rows = []
    for key in sorted(groups):
        agg = aggregate_samples(groups[key])
        means = [v for pair in zip(agg.sums, agg.counts, strict=True) for v in pair]
        rows.append((*key, agg.samples, agg.restarts, agg.up_samples, *means, agg.max_k))
    return rows


# Finite bounds per dialect: `x > -INF AND x < INF` drops NULL, infinities and (PostgreSQL,
# where NaN sorts above Infinity) NaN; SQLite stores NaN as NULL. 9e999 overflows to Infinity.
_INF = {"sqlite": "9e999", "postgresql": "'Infinity'::float8"}
# Length of a non-empty per-position acceptance: JSON text in SQLite (a list of numbers, so its
# commas + 1; never parsed, so no row can make a query fail), an array in PostgreSQL.
_K = {
    "sqlite": "CASE WHEN position_acceptance IS NULL OR position_acceptance = '[]' THEN NULL "
    "ELSE length(position_acceptance) - length(replace(position_acceptance, ',', '')) + 1 END",
    "postgresql": "NULLIF(cardinality(position_acceptance), 0)",
}


def aggregate_columns(dialect: str) -> list[str]:
    """SQL aggregates over engine_samples rows in `EngineAggregate` order (as `hour_rows`)."""
    inf = _INF[dialect]
    columns = [
        "COUNT(*)",
        "COUNT(CASE WHEN restarted THEN 1 END)",
        "COUNT(CASE WHEN up THEN 1 END)",
    ]
    for field in MEAN_FIELDS:
        finite = f"up AND {field} > -{inf} AND {field} < {inf}"
        columns.append(f"COALESCE(SUM(CASE WHEN {finite} THEN {field} END), 0)")
        columns.append(f"COUNT(CASE WHEN {finite} THEN 1 END)")
    columns.append(f"MAX(CASE WHEN up THEN {_K[dialect]} END)")
    return columns


def _hour_expr(dialect: str, t: str = "t") -> str:
    """`hour_of(t)` in SQL: floor(t / 3600), then corrected by one like `hour_of`."""
    h0 = (
        f"(CASE WHEN {t} / 3600 < CAST({t} / 3600 AS INTEGER) THEN CAST({t} / 3600 AS INTEGER) - 1 "
        f"ELSE CAST({t} / 3600 AS INTEGER) END)"
        if dialect == "sqlite"
        else f"CAST(floor({t} / 3600) AS BIGINT)"
    )
    return (
        f"(CASE WHEN {t} < {h0} * 3600 THEN {h0} - 1 WHEN {t} >= ({h0} + 1) * 3600 THEN {h0} + 1 "
        f"ELSE {h0} END)"
    )


def _aggregate_into_hours(table: str, columns: Sequence[str], dialect: str, where: str) -> str:
    """INSERT the hour rows of the engine samples matching `where` (no existing hour rows)."""
    return (
        f"INSERT INTO {table} ({', '.join(columns)}) "
        f"SELECT run_id, arm, h, {', '.join(aggregate_columns(dialect))} FROM "
        f"(SELECT *, {_hour_expr(dialect)} AS h FROM engine_samples WHERE {where}) AS s "
        "GROUP BY run_id, arm, h"
    )


def rebuild_hour_sql(table: str, columns: Sequence[str], dialect: str) -> tuple[str, str]:
    """Retention: (delete the hour rows up to the cut-off's hour, rebuild that hour from its
    kept samples); both take the cut-off time as their only parameter (run after the samples
    before it are deleted). `columns`: the hour table's, in `hour_rows` order."""
    p = "?1" if dialect == "sqlite" else "CAST($1 AS DOUBLE PRECISION)"
    h = _hour_expr(dialect, p)
    delete = f"DELETE FROM {table} WHERE hour <= {h}"
    where = f"t >= {p} AND t < {p} + {HOUR_S + 1} AND {_hour_expr(dialect)} <= {h}"
    return delete, _aggregate_into_hours(table, columns, dialect, where)
