"""SQL and result type of the per-minute rollup tables (schema v4), shared by the SQL backends.

Writes are ADDITIVE upserts: every replica adds the rollups of the rows it has just inserted
(rows already present, e.g. replayed from a spill file, are not added twice: the backends roll up
only the rows their INSERT actually created). Reads return plain (minute, bin, count) arrays per
arm; rows of several models in one minute are summed by the caller (`np.unique`), so no GROUP BY
and no sort are needed on the database side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from specproxy.store.schema import Dialect

__all__ = [
    "RollupRows",
    "delete_rollups_sql",
    "read_bins_sql",
    "read_minutes_sql",
    "rollup_rows_from",
    "upsert_bins_sql",
    "upsert_minutes_sql",
]

_MINUTE_COLS: Final = "run_id, minute, model, arm, metric, n, total, total_sq"
_BIN_COLS: Final = "run_id, minute, model, arm, metric, bin, count"


def _params(dialect: Dialect, n: int) -> str:
    return ", ".join("?" if dialect == "sqlite" else f"${i + 1}" for i in range(n))


def upsert_minutes_sql(dialect: Dialect) -> str:
    return (
        f"INSERT INTO rollup_minutes ({_MINUTE_COLS}) VALUES ({_params(dialect, 8)}) "
        "ON CONFLICT (run_id, metric, minute, model, arm) DO UPDATE SET "
        "n = rollup_minutes.n + excluded.n, "
        "total = rollup_minutes.total + excluded.total, "
        "total_sq = rollup_minutes.total_sq + excluded.total_sq"
    )


def upsert_bins_sql(dialect: Dialect) -> str:
    return (
        f"INSERT INTO rollup_bins ({_BIN_COLS}) VALUES ({_params(dialect, 7)}) "
        "ON CONFLICT (run_id, metric, minute, model, arm, bin) DO UPDATE SET "
        "count = rollup_bins.count + excluded.count"
    )


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


def delete_rollups_sql(dialect: Dialect) -> tuple[str, str]:
    p = "?" if dialect == "sqlite" else "$1"
    return (
        f"DELETE FROM rollup_minutes WHERE minute < {p}",
        f"DELETE FROM rollup_bins WHERE minute < {p}",
    )


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
