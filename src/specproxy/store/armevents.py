"""The `arm_events` table's SQL and rows, both dialects (`contract.Control`; schema version 9).

Ids come from the database (SQLite AUTOINCREMENT, PostgreSQL BIGSERIAL) and only grow, so a
replica polls with `id > last_id`. On PostgreSQL an id is taken before its transaction commits:
two writers at once could make id 7 visible before id 6, and a poller that saw 7 would skip 6
for good. Inserts therefore take `INSERT_LOCK_SQL` first (a transaction-scoped advisory lock
that only other inserts of events wait for; reads never do, and it needs no privilege beyond
the INSERT), so ids become visible in order. SQLite has one writer at a time.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from specproxy.control.events import ArmEvent
from specproxy.store.queries import placeholders
from specproxy.store.schema import Dialect

__all__ = [
    "INSERT_LOCK_KEY",
    "INSERT_LOCK_SQL",
    "event_from_row",
    "event_params",
    "insert_sql",
    "select_sql",
]

_COLUMNS: Final = "id, run_id, t, action, arm, weight, who, why"
INSERT_LOCK_KEY: Final = 0x5BEC_0002  # beside postgres.MIGRATION_LOCK_KEY (0x5BEC_0001)
INSERT_LOCK_SQL: Final = f"SELECT pg_advisory_xact_lock({INSERT_LOCK_KEY})"


def insert_sql(dialect: Dialect) -> str:
    """The INSERT of one event; PostgreSQL's returns the id (SQLite's is the cursor's rowid)."""
    sql = (
        "INSERT INTO arm_events (run_id, t, action, arm, weight, who, why) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)"
    )
    return placeholders(sql + (" RETURNING id" if dialect == "postgresql" else ""), dialect)


def select_sql(dialect: Dialect) -> str:
    return placeholders(
        f"SELECT {_COLUMNS} FROM arm_events WHERE run_id = ? AND id > ? ORDER BY id", dialect
    )


def event_params(event: ArmEvent) -> tuple[Any, ...]:
    """The INSERT's parameters, in `insert_sql` order."""
    return (event.run_id, event.t, event.action, event.arm, event.weight, event.who, event.why)


def event_from_row(row: Sequence[Any]) -> ArmEvent:
    """A stored row (`select_sql` order) as the event it holds."""
    id_, run_id, t, action, arm, weight, who, why = row
    return ArmEvent(
        run_id=run_id,
        t=float(t),
        action=action,
        arm=arm,
        weight=None if weight is None else float(weight),
        who=who,
        why=why,
        id=int(id_),
    )
