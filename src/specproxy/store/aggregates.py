"""The additive aggregates, each declared once as data; their SQL, DDL and memory table derived.

An aggregate is a table whose rows are keyed like its primary key and merge on conflict: `sums`
are added, `maxes` keep the larger (NULL: none). Every write adds the rows `rows` makes from what
that write inserted (`Inserted`: never a duplicate), so replicas, batches and spill replays add
up; a backend writes `aggregate_rows(inserted)` with `upsert_sql` (or `AdditiveTable.add`) and
cuts with `retention_sql`, with no code of its own per aggregate.

Adding an aggregate:
1. its declaration in `AGGREGATES`, whose `rows` makes its rows (column order, key first) from
   an `Inserted` batch;
2. a frozen migration in `migrations` creating its table (`create_table_sql` prints the DDL;
   tests/store/test_aggregates.py checks that the migrations create exactly the declared table);
3. whatever reads it (`contract.SummaryReader`), in each backend.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final, Literal

from specproxy.records import EngineSample, RequestRecord
from specproxy.store.enginehours import hour_of, hour_rows, rebuild_hour_sql
from specproxy.store.schema import Dialect
from specproxy.summary.engine import MEAN_FIELDS
from specproxy.summary.minute import MOMENT_SUMS, MomentRow, RollupBatch, as_is, rollup_records

__all__ = [
    "AGGREGATES",
    "ENGINE_HOURS",
    "ROLLUP_BINS",
    "ROLLUP_MINUTES",
    "ROLLUP_MOMENTS",
    "ROLLUP_MOMENT_HOURS",
    "AdditiveTable",
    "Aggregate",
    "Column",
    "Inserted",
    "RollupCut",
    "RowsCut",
    "aggregate_rows",
    "create_table_sql",
    "hour_moment_rows",
    "retention_sql",
    "total_sql",
    "upsert_sql",
]

Row = tuple[Any, ...]
ColumnType = Literal["text", "int", "bigint", "real"]
_SQL_TYPES: Final[dict[ColumnType, tuple[str, str]]] = {  # (SQLite, PostgreSQL)
    "text": ("TEXT", "TEXT"),
    "int": ("INTEGER", "INTEGER"),
    "bigint": ("INTEGER", "BIGINT"),
    "real": ("REAL", "DOUBLE PRECISION"),
}


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: ColumnType
    nullable: bool = False

    def sql_type(self, dialect: Dialect) -> str:
        return _SQL_TYPES[self.type][0 if dialect == "sqlite" else 1]


class Inserted:
    """What one write inserted (never a row already stored): every aggregate's input."""

    def __init__(
        self,
        requests: Sequence[RequestRecord] = (),
        engine: Sequence[EngineSample] = (),
        model_label: Callable[[str], str] = as_is,
    ) -> None:
        self.requests = requests
        self.engine = engine
        self.model_label = model_label  # rollup keys (`Sink.label_models`)

    @functools.cached_property
    def rollup(self) -> RollupBatch:
        """The minute rollup of the requests, computed once for the four tables it feeds."""
        return rollup_records(self.requests, self.model_label)


@dataclass(frozen=True, slots=True)
class RollupCut:
    """Cut with the rollups (`purge_rollups_older_than`, a minute): a row covering `span` minutes
    from its time goes once they all lie before the cut."""

    span: int = 1


@dataclass(frozen=True, slots=True)
class RowsCut:
    """Cut with the raw rows (`purge_older_than`, Unix time): rows of the units up to the cut's
    (`unit_of`) go, and the cut's unit is rebuilt from the raw rows kept: in SQL by
    `statements(table, columns, dialect)` (the cut time their one parameter), in memory from the
    aggregate's `rows` of the kept raw rows of that unit."""

    unit_of: Callable[[float], int]
    statements: Callable[[str, Sequence[str], Dialect], tuple[str, ...]]


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One additive table: columns are `keys` (the primary key, in order), `sums`, `maxes`."""

    table: str
    keys: tuple[Column, ...]
    sums: tuple[Column, ...]
    time: str  # the key column retention cuts on
    retention: RollupCut | RowsCut
    rows: Callable[[Inserted], Sequence[Row]]  # rows to add, in column order
    maxes: tuple[Column, ...] = ()
    without_rowid: bool = True  # SQLite's table kind (v7's engine_hours has a rowid)

    @property
    def columns(self) -> tuple[Column, ...]:
        return (*self.keys, *self.sums, *self.maxes)

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(c.name for c in self.columns)


def _text(name: str) -> Column:
    return Column(name, "text")


def _bigint(name: str, *, nullable: bool = False) -> Column:
    return Column(name, "bigint", nullable)


def _real(name: str) -> Column:
    return Column(name, "real")


_HOUR: Final = 60  # minutes


def hour_moment_rows(minute_rows: Sequence[MomentRow]) -> list[MomentRow]:
    """Moment rows of minutes summed per hour (start: the hour's first minute)."""
    hours: dict[tuple[Any, ...], list[Any]] = {}
    for run_id, minute, model, arm, *sums in minute_rows:
        acc = hours.setdefault((run_id, minute - minute % _HOUR, model, arm), [0] * len(sums))
        for i, value in enumerate(sums):
            acc[i] += value
    return [(*k, *v) for k, v in hours.items()]


_MOMENTS: Final = (_bigint("n"), *(_real(c) for c in MOMENT_SUMS[1:]))

ROLLUP_MINUTES: Final = Aggregate(
    table="rollup_minutes",
    keys=(_text("run_id"), _text("metric"), _bigint("minute"), _text("model"), _text("arm")),
    sums=(_bigint("n"), _real("total"), _real("total_sq")),
    time="minute",
    retention=RollupCut(),
    rows=lambda inserted: inserted.rollup.summaries,
)
ROLLUP_BINS: Final = Aggregate(
    table="rollup_bins",
    keys=(*ROLLUP_MINUTES.keys, Column("bin", "int")),
    sums=(_bigint("count"),),
    time="minute",
    retention=RollupCut(),
    rows=lambda inserted: inserted.rollup.bins,
)
ROLLUP_MOMENTS: Final = Aggregate(
    table="rollup_moments",
    keys=(_text("run_id"), _bigint("minute"), _text("model"), _text("arm")),
    sums=_MOMENTS,
    time="minute",
    retention=RollupCut(),
    rows=lambda inserted: inserted.rollup.moments,
)
ROLLUP_MOMENT_HOURS: Final = Aggregate(
    table="rollup_moment_hours",
    keys=(_text("run_id"), _bigint("start"), _text("model"), _text("arm")),
    sums=_MOMENTS,
    time="start",
    retention=RollupCut(span=_HOUR),  # an hour cut in the middle keeps its earlier minutes
    rows=lambda inserted: hour_moment_rows(inserted.rollup.moments),
)
ENGINE_HOURS: Final = Aggregate(
    table="engine_hours",
    keys=(_text("run_id"), _text("arm"), _bigint("hour")),
    sums=(
        _bigint("n"),
        _bigint("restarts"),
        _bigint("up_samples"),
        *(c for f in MEAN_FIELDS for c in (_real(f"sum_{f}"), _bigint(f"n_{f}"))),
    ),
    maxes=(_bigint("max_k", nullable=True),),
    time="hour",
    retention=RowsCut(unit_of=hour_of, statements=rebuild_hour_sql),
    rows=lambda inserted: hour_rows(inserted.engine),
    without_rowid=False,
)
AGGREGATES: Final[tuple[Aggregate, ...]] = (
    ROLLUP_MINUTES,
    ROLLUP_BINS,
    ROLLUP_MOMENTS,
    ROLLUP_MOMENT_HOURS,
    ENGINE_HOURS,
)


def aggregate_rows(inserted: Inserted) -> list[tuple[Aggregate, list[Row]]]:
    """Each aggregate with the rows to add for `inserted` (none: left out), in key order, so
    concurrent writers lock rows in one order."""
    out = []
    for aggregate in AGGREGATES:
        width = len(aggregate.keys)
        rows = sorted(aggregate.rows(inserted), key=lambda row: row[:width])
        if rows:
            out.append((aggregate, rows))
    return out


def _marks(dialect: Dialect, n: int) -> str:
    return ", ".join("?" if dialect == "sqlite" else f"${i}" for i in range(1, n + 1))


def upsert_sql(aggregate: Aggregate, dialect: Dialect) -> str:
    """Add one row (all columns, in order): sums added, maxes the larger."""
    t = aggregate.table
    sets = [f"{c.name} = {t}.{c.name} + excluded.{c.name}" for c in aggregate.sums]
    for c in aggregate.maxes:
        m = c.name
        sets.append(
            f"{m} = CASE WHEN excluded.{m} IS NULL THEN {t}.{m} WHEN {t}.{m} IS NULL THEN "
            f"excluded.{m} ELSE max({t}.{m}, excluded.{m}) END"
            if dialect == "sqlite"
            else f"{m} = GREATEST({t}.{m}, excluded.{m})"  # NULL-ignoring
        )
    names = aggregate.column_names
    keys = ", ".join(c.name for c in aggregate.keys)
    return (
        f"INSERT INTO {t} ({', '.join(names)}) VALUES ({_marks(dialect, len(names))}) "
        f"ON CONFLICT ({keys}) DO UPDATE SET {', '.join(sets)}"
    )


def retention_sql(aggregate: Aggregate, dialect: Dialect) -> tuple[str, ...]:
    """The statements of the aggregate's cut, each taking the cut (a minute for `RollupCut`,
    Unix time for `RowsCut`) as its one parameter."""
    cut = aggregate.retention
    if isinstance(cut, RowsCut):
        return cut.statements(aggregate.table, aggregate.column_names, dialect)
    p = "?" if dialect == "sqlite" else "$1"
    t, time = aggregate.table, aggregate.time
    if cut.span == 1:
        return (f"DELETE FROM {t} WHERE {time} < {p}",)
    return (f"DELETE FROM {t} WHERE {time} + {cut.span} <= {p}",)


def total_sql(aggregate: Aggregate, where: str) -> str:
    """One row merging the rows that match `where` (`?` placeholders) as upserts would: sums of
    `sums`, maxima of `maxes` (NULL sums when none match)."""
    merged = [f"SUM({c.name})" for c in aggregate.sums]
    merged += [f"MAX({c.name})" for c in aggregate.maxes]
    return f"SELECT {', '.join(merged)} FROM {aggregate.table} WHERE {where}"


def create_table_sql(aggregate: Aggregate, dialect: Dialect) -> str:
    """The table's DDL, as a frozen migration would spell it."""
    columns = [
        f"{c.name} {c.sql_type(dialect)}{'' if c.nullable else ' NOT NULL'}"
        for c in aggregate.columns
    ]
    keys = ", ".join(c.name for c in aggregate.keys)
    body = ",\n    ".join([*columns, f"PRIMARY KEY ({keys})"])
    suffix = " WITHOUT ROWID" if dialect == "sqlite" and aggregate.without_rowid else ""
    return f"CREATE TABLE IF NOT EXISTS {aggregate.table} (\n    {body}\n){suffix}"


class AdditiveTable:
    """An aggregate's table in memory: rows keyed like its primary key, merged as `upsert_sql`
    merges them."""

    def __init__(self, aggregate: Aggregate) -> None:
        self.aggregate = aggregate
        self._width = len(aggregate.keys)
        self._sums = len(aggregate.sums)
        self._time = [c.name for c in aggregate.keys].index(aggregate.time)
        self._rows: dict[Row, list[Any]] = {}

    def add(self, rows: Iterable[Row]) -> None:
        k, s = self._width, self._sums
        for row in rows:
            key = row[:k]
            acc = self._rows.get(key)
            if acc is None:
                self._rows[key] = list(row[k:])
                continue
            for i, value in enumerate(row[k:]):
                acc[i] = acc[i] + value if i < s else _larger(acc[i], value)

    def select(self, where: Callable[[Row], bool]) -> list[Row]:
        """Rows (all columns) whose key matches `where`."""
        return [(*key, *values) for key, values in self._rows.items() if where(key)]

    def take(self, where: Callable[[Row], bool]) -> list[Row]:
        """`select`, deleting the rows returned."""
        rows = self.select(where)
        for row in rows:
            del self._rows[row[: self._width]]
        return rows

    def total(self, where: Callable[[Row], bool]) -> list[Any] | None:
        """The values of the rows whose key matches, merged (`total_sql`); None when none do."""
        merged: list[Any] | None = None
        for key, values in self._rows.items():
            if not where(key):
                continue
            if merged is None:
                merged = list(values)
                continue
            for i, value in enumerate(values):
                merged[i] = merged[i] + value if i < self._sums else _larger(merged[i], value)
        return merged

    def cut(self, before: int) -> int:
        """`RollupCut` retention before a minute; the rows removed."""
        cut = self.aggregate.retention
        assert isinstance(cut, RollupCut)
        return len(self.take(lambda key: key[self._time] + cut.span <= before))

    def cut_through(self, unit: int) -> int:
        """Remove the rows of units up to `unit` (`RowsCut`, before the rebuild of `unit`)."""
        return len(self.take(lambda key: key[self._time] <= unit))


def _larger(a: Any, b: Any) -> Any:
    if a is None:
        return b
    return a if b is None else max(a, b)
