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

from specproxy.summary.minute import MOMENT_SUMS

__all__ = [
    "MomentRead",
    "read_moments_sql",
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
