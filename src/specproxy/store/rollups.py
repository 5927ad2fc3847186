"""The SQL of the rollup tiers the stats read and compact, shared by the SQL backends.

Fine rows (`rollup_minutes`, `rollup_bins`: schema v4) and the moments (v8) are additive
aggregates written by every replica (`aggregates`); the stats leader's compaction takes closed
fine rows (DELETE ... RETURNING) and writes them, folded, into `rollup_blocks` (v5), whose rows
carry their request count `n`, the version a reader compares (`contract.TierVersions`).
Deferred rollups (schema v13, `store.rollups = "deferred"`): a proxy inserts its request rows with
`rollup_pending` set and no rollups; the leader takes them (`take_pending_sql`) and writes their
rollups in the same transaction.
"""

from __future__ import annotations

from typing import Final

from specproxy.store.contract import BlockKey, TierVersions
from specproxy.store.schema import REQUEST_COLUMNS, Dialect
from specproxy.summary.minute import MOMENT_SUMS

__all__ = [
    "BLOCK_COLS",
    "block_blobs_sql",
    "block_list_sql",
    "changed_blocks",
    "changed_minutes",
    "delete_blocks_before_sql",
    "delete_blocks_returning_sql",
    "delete_fine_returning_sql",
    "fine_bins_of_minute_sql",
    "fine_minutes_sql",
    "read_moments_sql",
    "stored_block_sql",
    "take_pending_sql",
    "upsert_block_sql",
]

BLOCK_COLS: Final = "run_id, metric, start, span, model, arm, n, blob"


def _p(dialect: Dialect, n: int) -> list[str]:
    return ["?" if dialect == "sqlite" else f"${i + 1}" for i in range(n)]


def take_pending_sql(dialect: Dialect) -> str:
    """Mark at most N (the one param) pending request rows done and return them, every column of
    `REQUEST_COLUMNS`. SQLite runs one writer at a time; PostgreSQL locks the rows it takes and
    skips those another folder holds, so two folders never take one row."""
    cols = ", ".join(REQUEST_COLUMNS)
    if dialect == "sqlite":
        return (
            "UPDATE requests SET rollup_pending = 0 WHERE rowid IN "
            "(SELECT rowid FROM requests WHERE rollup_pending = 1 LIMIT ?) "
            f"RETURNING {cols}"
        )
    return (
        "UPDATE requests SET rollup_pending = false WHERE rollup_pending AND "
        "(run_id, request_id, arm, shadow) IN (SELECT run_id, request_id, arm, shadow "
        "FROM requests WHERE rollup_pending LIMIT $1 FOR UPDATE SKIP LOCKED) "
        f"RETURNING {cols}"
    )


def delete_blocks_before_sql(dialect: Dialect) -> str:
    """Rollup retention of the block tier: blocks that end before a minute (param)."""
    return f"DELETE FROM rollup_blocks WHERE start + span <= {'?' if dialect == 'sqlite' else '$1'}"


def upsert_block_sql(dialect: Dialect) -> str:
    """Write a block the compactor has already merged with the stored one (read-modify-write
    under the compaction transaction), so the update replaces."""
    return (
        f"INSERT INTO rollup_blocks ({BLOCK_COLS}) VALUES ({', '.join(_p(dialect, 8))}) "
        "ON CONFLICT (run_id, metric, start, span, model, arm) DO UPDATE SET "
        "n = excluded.n, blob = excluded.blob"
    )


def delete_fine_returning_sql(dialect: Dialect) -> tuple[str, str]:
    """Take (delete and return) the fine rows of a run's metric before a minute; params run,
    metric, bound (the primary key's prefix, so no scan of other metrics). RETURNING names
    exactly the rows removed, so a row a replica adds meanwhile is either returned or left for
    the next pass, never lost."""
    p = _p(dialect, 3)
    where = f"WHERE run_id = {p[0]} AND metric = {p[1]} AND minute < {p[2]}"
    return (
        f"DELETE FROM rollup_minutes {where} RETURNING metric, minute, model, arm, n, total, "
        "total_sq",
        f"DELETE FROM rollup_bins {where} RETURNING metric, minute, model, arm, bin, count",
    )


def delete_blocks_returning_sql(dialect: Dialect) -> str:
    """Take the 1-minute blocks of a run's metric that start before a bound; params run, metric,
    bound."""
    p = _p(dialect, 3)
    return (
        f"DELETE FROM rollup_blocks WHERE run_id = {p[0]} AND metric = {p[1]} AND start < {p[2]} "
        "AND span = 1 "
        "RETURNING metric, start, model, arm, blob"
    )


def stored_block_sql(dialect: Dialect) -> str:
    """One block's blob; params run, metric, start, span, model, arm."""
    p = _p(dialect, 6)
    return (
        f"SELECT blob FROM rollup_blocks WHERE run_id = {p[0]} AND metric = {p[1]} "
        f"AND start = {p[2]} AND span = {p[3]} AND model = {p[4]} AND arm = {p[5]}"
    )


def block_list_sql(dialect: Dialect) -> str:
    """(start, span, model, arm, n) of every block of a run and metric; params run, metric."""
    p = _p(dialect, 2)
    return (
        "SELECT start, span, model, arm, n FROM rollup_blocks "
        f"WHERE run_id = {p[0]} AND metric = {p[1]}"
    )


def block_blobs_sql(dialect: Dialect, *, one: bool) -> str:
    """(start, span, model, arm, blob) of a run and metric: every block, or (`one`) the block
    with params start, span, model, arm after run, metric."""
    p = _p(dialect, 6)
    sql = (
        "SELECT start, span, model, arm, blob FROM rollup_blocks "
        f"WHERE run_id = {p[0]} AND metric = {p[1]}"
    )
    if one:
        sql += f" AND start = {p[2]} AND span = {p[3]} AND model = {p[4]} AND arm = {p[5]}"
    return sql


def fine_minutes_sql(dialect: Dialect) -> str:
    """Every fine summary of a run and metric; params run, metric."""
    p = _p(dialect, 2)
    return (
        "SELECT minute, model, arm, n, total, total_sq FROM rollup_minutes "
        f"WHERE run_id = {p[0]} AND metric = {p[1]}"
    )


def fine_bins_of_minute_sql(dialect: Dialect) -> str:
    """Fine bins of one minute of a run and metric, ONE row per (model, arm): model, arm and its
    bins and counts packed (`contract.Packed`: SQLite comma-separated text, PostgreSQL
    big-endian int4 / int8 bytes); params run, metric, minute. Packed because a cold reader gets
    ~160k fine rows per metric and a Python tuple per row cost more than the rest of the read
    (`summary.packed.fine_bins_arrays` unpacks them straight into arrays, in bin order)."""
    p = _p(dialect, 3)
    where = f"WHERE run_id = {p[0]} AND metric = {p[1]} AND minute = {p[2]}"
    if dialect == "sqlite":
        # the primary key's order (run, metric, minute, model, arm, bin): each group's rows are
        # visited in bin order (the unpacking sorts if they were not)
        packed = "group_concat(bin), group_concat(count)"
    else:
        # no ORDER BY: both aggregates of a group take its rows in one order, so bins and counts
        # stay aligned, and the unpacking sorts them when that order is not the bins'; the
        # per-group sort was half of a cold reader's store time (0.49 of 0.76 s at 30 days)
        packed = "string_agg(int4send(bin), ''::bytea), string_agg(int8send(count), ''::bytea)"
    return f"SELECT model, arm, {packed} FROM rollup_bins {where} GROUP BY model, arm"


def changed_blocks(
    listing: list[tuple[int, int, str, str, int]], known: TierVersions
) -> list[BlockKey]:
    return [(s, sp, m, a) for s, sp, m, a, n in listing if known.blocks.get((s, sp, m, a)) != n]


def changed_minutes(
    minutes: list[tuple[int, str, str, int, float, float]], known: TierVersions
) -> list[int]:
    """Minutes holding a fine row whose `n` the reader does not have (its bins are read)."""
    return sorted({m for m, mo, a, n, _t, _s in minutes if known.fine.get((m, mo, a)) != n})


def read_moments_sql(dialect: Dialect, *, hours: bool) -> str:
    """Hours: every hour row of a run (params run); minutes: the run's minute rows from a minute
    on (params run, since_minute). Columns: start or minute, model, arm, *MOMENT_SUMS."""
    cols = ", ".join(MOMENT_SUMS)
    p = _p(dialect, 2)
    if hours:
        return f"SELECT start, model, arm, {cols} FROM rollup_moment_hours WHERE run_id = {p[0]}"
    return (
        f"SELECT minute, model, arm, {cols} FROM rollup_moments "
        f"WHERE run_id = {p[0]} AND minute >= {p[1]}"
    )
