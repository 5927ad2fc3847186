"""SQL and result types of the rollup tables (fine rows: schema v4; blocks: v5), shared by the
SQL backends.

Writes are ADDITIVE upserts: every replica adds the rollups of the rows it has just inserted
(rows already present, e.g. replayed from a spill file, are not added twice: the backends roll up
only the rows their INSERT actually created). Reads return plain (minute, bin, count) arrays per
arm; rows of several models in one minute are summed by the caller (`np.unique`), so no GROUP BY
and no sort are needed on the database side.

Tiers (issue 14, scale): replicas write fine per-minute rows; the stats leader moves closed minutes
into `rollup_blocks` (`compaction`), whose rows carry their request count `n`. `n` only grows
when rows are folded in, so it is the block's version: a reader that remembers the `n` of each
block and fine minute it holds (`TierVersions`) gets back only what changed (`TierRead`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproxy.store.schema import Dialect

__all__ = [
    "BLOCK_COLS",
    "BlockKey",
    "FineKey",
    "RollupRows",
    "TierRead",
    "TierVersions",
    "block_blobs_sql",
    "block_list_sql",
    "changed_blocks",
    "changed_minutes",
    "delete_blocks_before_sql",
    "delete_blocks_returning_sql",
    "delete_fine_returning_sql",
    "fine_bins_arrays",
    "fine_bins_of_minute_sql",
    "fine_minutes_sql",
    "group_fine_bins",
    "read_bins_sql",
    "read_minutes_sql",
    "rollup_rows_from",
    "stored_block_sql",
    "upsert_block_sql",
]


def _params(dialect: Dialect, n: int) -> str:
    return ", ".join("?" if dialect == "sqlite" else f"${i + 1}" for i in range(n))


def _where(dialect: Dialect, with_model: bool) -> str:
    p = ["?" if dialect == "sqlite" else f"${i}" for i in range(7)]
    where = f"run_id = {p[1]} AND metric = {p[2]} AND minute >= {p[3]} AND minute < {p[4]}"
    where += f" AND arm = {p[5]}"
    if with_model:
        where += f" AND model = {p[6]}"
    return where


def read_minutes_sql(dialect: Dialect, *, with_model: bool) -> str:
    """(minute, n, total, total_sq) rows of one arm; params run, metric, lo, hi, arm[, model]."""
    return (
        f"SELECT minute, n, total, total_sq FROM rollup_minutes WHERE {_where(dialect, with_model)}"
    )


def read_bins_sql(dialect: Dialect, *, with_model: bool) -> str:
    """(minute, bin, count) rows of one arm; params run, metric, lo, hi, arm[, model]."""
    return f"SELECT minute, bin, count FROM rollup_bins WHERE {_where(dialect, with_model)}"


def delete_blocks_before_sql(dialect: Dialect) -> str:
    """Rollup retention of the block tier: blocks that end before a minute (param)."""
    return f"DELETE FROM rollup_blocks WHERE start + span <= {'?' if dialect == 'sqlite' else '$1'}"


# -- the block tier (schema v5) ------------------------------------------------------------------

BLOCK_COLS: Final = "run_id, metric, start, span, model, arm, n, blob"
BlockKey = tuple[int, int, str, str]  # start, span, model, arm (of one run and metric)
FineKey = tuple[int, str, str]  # minute, model, arm


def upsert_block_sql(dialect: Dialect) -> str:
    """Write a block the compactor has already merged with the stored one (read-modify-write
    under the compaction transaction), so the update replaces."""
    return (
        f"INSERT INTO rollup_blocks ({BLOCK_COLS}) VALUES ({_params(dialect, 8)}) "
        "ON CONFLICT (run_id, metric, start, span, model, arm) DO UPDATE SET "
        "n = excluded.n, blob = excluded.blob"
    )


def _p(dialect: Dialect, n: int) -> list[str]:
    return ["?" if dialect == "sqlite" else f"${i + 1}" for i in range(n)]


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
    bins and counts packed in bin order (SQLite: comma-separated text; PostgreSQL: big-endian
    int4 / int8 bytes); params run, metric, minute. Why packed: a cold reader gets ~160k fine
    rows per metric, and a Python tuple per row cost more than the rest of the read
    (`fine_bins_arrays` unpacks them straight into arrays)."""
    p = _p(dialect, 3)
    where = f"WHERE run_id = {p[0]} AND metric = {p[1]} AND minute = {p[2]}"
    if dialect == "sqlite":
        # the primary key's order (run, metric, minute, model, arm, bin): each group's rows are
        # visited in bin order (`fine_bins_arrays` sorts if they were not)
        packed = "group_concat(bin), group_concat(count)"
    else:
        # no ORDER BY: both aggregates of a group take its rows in one order, so bins and counts
        # stay aligned, and `fine_bins_arrays` sorts them when that order is not the bins'; the
        # per-group sort was half of a cold reader's store time (0.49 of 0.76 s at 30 days)
        packed = "string_agg(int4send(bin), ''::bytea), string_agg(int8send(count), ''::bytea)"
    return f"SELECT model, arm, {packed} FROM rollup_bins {where} GROUP BY model, arm"


def fine_bins_arrays(
    bins: str | bytes, counts: str | bytes
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(bins, counts) arrays in ascending bin order from one packed row of
    `fine_bins_of_minute_sql` (text from SQLite, bytes from PostgreSQL)."""
    if isinstance(bins, str) and isinstance(counts, str):
        b = np.fromstring(bins, dtype=np.int64, sep=",")
        c = np.fromstring(counts, dtype=np.int64, sep=",")
    elif isinstance(bins, bytes) and isinstance(counts, bytes):
        b = np.frombuffer(bins, dtype=">i4").astype(np.int64)
        c = np.frombuffer(counts, dtype=">i8").astype(np.int64)
    else:
        raise TypeError("packed fine bins must be both text or both bytes")
    if b.size != c.size:
        raise ValueError("packed fine bins and counts differ in length")
    if b.size > 1 and not bool(np.all(b[1:] > b[:-1])):
        order = np.argsort(b, kind="stable")
        b, c = b[order], c[order]
    return b, c


@dataclass(frozen=True, slots=True)
class TierVersions:
    """What a reader holds already: the `n` of each block and of each fine minute."""

    blocks: Mapping[BlockKey, int] = field(default_factory=dict)
    fine: Mapping[FineKey, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TierRead:
    """One metric of one run from one snapshot: every block's and fine minute's key and `n`,
    and the contents of those whose `n` differs from the reader's `TierVersions`."""

    blocks: list[tuple[int, int, str, str, int]]  # start, span, model, arm, n: all of them
    blobs: dict[BlockKey, bytes]  # changed blocks only
    minutes: list[tuple[int, str, str, int, float, float]]  # minute, model, arm, n, total, sq
    # (bins, counts) per fine (minute, model, arm), bins ascending, of the minutes holding a
    # changed key only
    bins: dict[FineKey, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]

    def requests(self) -> dict[str, int]:
        """Requests per arm name in the whole snapshot (every block and fine minute, changed or
        not): what the reader's tiers hold once it applies this read."""
        out: dict[str, int] = {}
        for *_key, arm, n in self.blocks:
            out[arm] = out.get(arm, 0) + n
        for _minute, _model, arm, n, _total, _sq in self.minutes:
            out[arm] = out.get(arm, 0) + n
        return out

    @property
    def rows(self) -> int:
        """Rows (or blobs) the read transferred."""
        fine = sum(b.size for b, _c in self.bins.values())
        return len(self.blocks) + len(self.blobs) + len(self.minutes) + fine


def changed_blocks(
    listing: list[tuple[int, int, str, str, int]], known: TierVersions
) -> list[BlockKey]:
    return [(s, sp, m, a) for s, sp, m, a, n in listing if known.blocks.get((s, sp, m, a)) != n]


def group_fine_bins(
    rows: Iterable[Any],
    into: dict[FineKey, tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]],
) -> None:
    """Add (minute, model, arm, bin, count) rows of ONE minute to `into` as arrays per key, in
    ascending bin order (the in-memory store's read; the SQL backends use `fine_bins_arrays`)."""
    grouped: dict[FineKey, list[tuple[int, int]]] = {}
    for minute, model, arm, b, c in rows:
        grouped.setdefault((minute, model, arm), []).append((b, c))
    for key, pairs in grouped.items():
        a = np.array(sorted(pairs), dtype=np.int64).reshape(-1, 2)
        into[key] = (a[:, 0].copy(), a[:, 1].copy())


def changed_minutes(
    minutes: list[tuple[int, str, str, int, float, float]], known: TierVersions
) -> list[int]:
    """Minutes holding a fine row whose `n` the reader does not have (its bins are read)."""
    return sorted({m for m, mo, a, n, _t, _s in minutes if known.fine.get((m, mo, a)) != n})


@dataclass(frozen=True, slots=True)
class RollupRows:
    """One arm's rollups of one metric over a minute range (rows of several models not summed)."""

    minute: npt.NDArray[np.int64]
    n: npt.NDArray[np.int64]
    total: npt.NDArray[np.float64]
    total_sq: npt.NDArray[np.float64]
    bin_minute: npt.NDArray[np.int64]
    bins: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]


def rollup_rows_from(
    minutes: list[tuple[int, int, float, float]] | npt.NDArray[np.float64],
    bins: list[tuple[int, int, int]] | npt.NDArray[np.int64],
) -> RollupRows:
    m = np.asarray(minutes, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(bins, dtype=np.int64).reshape(-1, 3)
    return RollupRows(
        minute=m[:, 0].astype(np.int64),
        n=m[:, 1].astype(np.int64),
        total=m[:, 2].copy(),
        total_sq=m[:, 3].copy(),
        bin_minute=b[:, 0].copy(),
        bins=b[:, 1].copy(),
        counts=b[:, 2].copy(),
    )
