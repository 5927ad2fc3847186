"""Hourly aggregates of engine samples (table `engine_hours`, schema v7) and their SQL.

A tick summarises the engine samples of every window (`engineagg.EngineAggregate`); the whole
run of a 30-day run is 518,400 samples per arm per replica, too many to aggregate per tick even
in SQL (~1 CPU-s on SQLite). So every write adds the samples it inserted (never a duplicate:
the backends keep only the rows the insert took) into one row per (run, arm, hour): counts,
sums and max k, the fields of `EngineAggregate`. A window from `since` then reads the samples of
[since, the next whole hour) by the (run_id, arm, t) key and the hour rows after it: at most an
hour of samples plus one row per hour, whatever the run's length, and exactly the same samples
as the old per-sample read (hours are split on exact boundaries, `hour_of`).

Retention (`Store.purge`) deletes the hours before the cut-off's hour and rebuilds that hour from
the samples it keeps (`rebuild_hour_sql`), so the aggregates always cover exactly the stored
samples.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

from specproxy.records import EngineSample
from specproxy.summary.engine import MEAN_FIELDS, aggregate_samples

__all__ = [
    "HOUR_COLUMNS",
    "HOUR_S",
    "aggregate_columns",
    "first_hour_from",
    "hour_of",
    "hour_rows",
    "hours_sum_sql_text",
    "rebuild_hour_sql",
    "upsert_hours_sql",
]

HOUR_S = 3600

HOUR_COLUMNS: tuple[str, ...] = (
    "run_id",
    "arm",
    "hour",
    "n",
    "restarts",
    "up_samples",
    *(c for f in MEAN_FIELDS for c in (f"sum_{f}", f"n_{f}")),
    "max_k",
)
_VALUES = HOUR_COLUMNS[3:]  # the additive part


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
    """Newly inserted samples as `HOUR_COLUMNS` rows to add, one per (run, arm, hour), in key
    order (so concurrent writers lock hour rows in one order)."""
    groups: dict[tuple[str, str, int], list[EngineSample]] = {}
    for s in samples:
        groups.setdefault((s.run_id, s.arm.value, hour_of(s.t)), []).append(s)
    rows = []
    for key in sorted(groups):
        agg = aggregate_samples(groups[key])
        means = [v for pair in zip(agg.sums, agg.counts, strict=True) for v in pair]
        rows.append((*key, agg.samples, agg.restarts, agg.up_samples, *means, agg.max_k))
    return rows


def upsert_hours_sql(dialect: str) -> str:
    """Add a `hour_rows` row to its hour (counts and sums added, max k the larger)."""
    marks = ", ".join("?" if dialect == "sqlite" else f"${i}" for i in range(1, 16))
    sets = [f"{c} = engine_hours.{c} + excluded.{c}" for c in _VALUES if c != "max_k"]
    if dialect == "sqlite":
        sets.append(
            "max_k = CASE WHEN excluded.max_k IS NULL THEN engine_hours.max_k "
            "WHEN engine_hours.max_k IS NULL THEN excluded.max_k "
            "ELSE max(engine_hours.max_k, excluded.max_k) END"
        )
    else:
        sets.append("max_k = GREATEST(engine_hours.max_k, excluded.max_k)")
    return (
        f"INSERT INTO engine_hours ({', '.join(HOUR_COLUMNS)}) VALUES ({marks}) "
        f"ON CONFLICT (run_id, arm, hour) DO UPDATE SET {', '.join(sets)}"
    )


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
    """SQL aggregates over engine_samples rows in `EngineAggregate` order (the `_VALUES`)."""
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


def hours_sum_sql_text() -> str:
    """The sum of a run's and arm's hour rows from hour ? on (or all: pass the hour of -inf as
    a very small number), in `EngineAggregate` order; `?` placeholders."""
    sums = ", ".join(f"SUM({c})" for c in _VALUES if c != "max_k")
    return f"SELECT {sums}, MAX(max_k) FROM engine_hours WHERE run_id = ? AND arm = ? AND hour >= ?"


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


def _aggregate_into_hours(dialect: str, where: str) -> str:
    """INSERT the hour rows of the engine samples matching `where` (no existing hour rows)."""
    return (
        f"INSERT INTO engine_hours ({', '.join(HOUR_COLUMNS)}) "
        f"SELECT run_id, arm, h, {', '.join(aggregate_columns(dialect))} FROM "
        f"(SELECT *, {_hour_expr(dialect)} AS h FROM engine_samples WHERE {where}) AS s "
        "GROUP BY run_id, arm, h"
    )


def rebuild_hour_sql(dialect: str) -> tuple[str, str]:
    """Retention: (delete the hour rows up to the cut-off's hour, rebuild that hour from its
    kept samples); both take the cut-off time as their only parameter (run after the samples
    before it are deleted)."""
    p = "?1" if dialect == "sqlite" else "CAST($1 AS DOUBLE PRECISION)"
    h = _hour_expr(dialect, p)
    delete = f"DELETE FROM engine_hours WHERE hour <= {h}"
    where = f"t >= {p} AND t < {p} + {HOUR_S + 1} AND {_hour_expr(dialect)} <= {h}"
    return delete, _aggregate_into_hours(dialect, where)
