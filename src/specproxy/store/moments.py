"""The length adjustment's sufficient statistics per minute and per hour (schema v8) and their SQL.

Every write adds the `rollup.MOMENT_SUMS` of the requests it inserted (never a duplicate: the
backends roll up only the rows their INSERT took) to one row per (run, minute, model, arm) in
`rollup_moments` and to one row per (run, hour, model, arm) in `rollup_moment_hours` (`start`:
the hour's first minute, as the hour blocks of `rollup_blocks`). Rows are additive, like every
rollup, so replicas and retries add up.

A tick reads every hour row of the run (720 per model and arm in 30 days) and the minute rows
from the earliest minute-unit window on (`read_moments_sql`): a window whose bootstrap blocks
are whole hours (it reaches the hour tier) takes hours, the others minutes, so a tick reads a
few thousand rows whatever the run's length. Nothing is compacted: a minute row is one row
per minute, model and arm.

Retention (`delete_moments_sql`, with the other rollups): minutes before the cut-off, and the
hours that end before it (an hour cut in the middle keeps its earlier minutes' sums until it
ends). Stores upgraded from v7 start these tables empty: their older windows have no
adjustment from rollups (its `n` says how many requests it covers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specproxy.summary.minute import MOMENT_SUMS, MomentRow

__all__ = [
    "MomentRead",
    "delete_moments_sql",
    "hour_moment_rows",
    "read_moments_sql",
    "upsert_moments_sql",
]

_SUMS = MOMENT_SUMS[1:]


@dataclass(frozen=True, slots=True)
class MomentRead:
    """One run's moment rows (`Store.read_moments`): (start, model, arm, *MOMENT_SUMS) per hour,
    and (minute, model, arm, *MOMENT_SUMS) per minute from the minute asked for."""

    hours: list[tuple[Any, ...]]
    minutes: list[tuple[Any, ...]]


_HOUR = 60  # minutes


def _params(dialect: str, n: int) -> str:
    return ", ".join("?" if dialect == "sqlite" else f"${i + 1}" for i in range(n))


def upsert_moments_sql(dialect: str, *, hours: bool) -> str:
    """Add one (run, minute or hour start, model, arm, *MOMENT_SUMS) row."""
    table, time_col = ("rollup_moment_hours", "start") if hours else ("rollup_moments", "minute")
    cols = ("run_id", time_col, "model", "arm", *MOMENT_SUMS)
    adds = ", ".join(f"{c} = {table}.{c} + excluded.{c}" for c in MOMENT_SUMS)
    return (
        f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({_params(dialect, len(cols))}) "
        f"ON CONFLICT (run_id, {time_col}, model, arm) DO UPDATE SET {adds}"
    )


def hour_moment_rows(minute_rows: list[MomentRow]) -> list[MomentRow]:
    """The minute rows of a write summed per hour (the hour table's rows to add), in key order
    (concurrent writers lock hour rows in one order)."""
    hours: dict[tuple[Any, ...], list[float]] = {}
    for run_id, minute, model, arm, *sums in minute_rows:
        acc = hours.setdefault((run_id, minute - minute % _HOUR, model, arm), [0.0] * len(sums))
        for i, value in enumerate(sums):
            acc[i] += value
    return [(*k, int(v[0]), *v[1:]) for k, v in sorted(hours.items())]


def read_moments_sql(dialect: str, *, hours: bool) -> str:
    """Hours: every hour row of a run (params run); minutes: the run's minute rows from a minute
    on (params run, since_minute). Columns: start or minute, model, arm, *MOMENT_SUMS."""
    cols = ", ".join(MOMENT_SUMS)
    if hours:
        return f"SELECT start, model, arm, {cols} FROM rollup_moment_hours WHERE run_id = " + (
            "?" if dialect == "sqlite" else "$1"
        )
    p = ("?", "?") if dialect == "sqlite" else ("$1", "$2")
    return (
        f"SELECT minute, model, arm, {cols} FROM rollup_moments "
        f"WHERE run_id = {p[0]} AND minute >= {p[1]}"
    )


def delete_moments_sql(dialect: str) -> tuple[str, str]:
    """Retention before a minute (param): minute rows before it, hours that end before it."""
    p = "?" if dialect == "sqlite" else "$1"
    return (
        f"DELETE FROM rollup_moments WHERE minute < {p}",
        f"DELETE FROM rollup_moment_hours WHERE start + {_HOUR} <= {p}",
    )
