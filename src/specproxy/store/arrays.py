"""Turning fetched rows (or an Arrow table) into the column arrays of `ArmArrays`.

The conversion is the hot part of a 1M-row read, so it stays in C loops: fetched rows become one
2-D object array and each column is cast from there; an Arrow table (SQLite read through ADBC) is
cast column by column in Arrow. Either way None becomes NaN in float columns, booleans come back as
bool arrays and strings as object arrays, so callers cannot tell the two paths apart.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.errors import StoreError
from specproxy.records import RECORD_FIELDS

__all__ = [
    "BOOL_COLUMNS",
    "TEXT_COLUMNS",
    "ArmArrays",
    "arrow_to_arrays",
    "check_columns",
    "empty_arrays",
    "rows_to_arrays",
]

# column name -> values, one entry per record, in t_start order. Numeric columns are float64
# (None -> NaN), booleans are bool arrays, strings (model, pair_id, ...) are object arrays.
ArmArrays = dict[str, npt.NDArray[Any]]

BOOL_COLUMNS = frozenset({"stream", "shadow", "disconnected"})
TEXT_COLUMNS = frozenset(
    {"request_id", "run_id", "arm", "model", "endpoint", "pair_id", "error_kind", "engine_url"}
)


def check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """The requested columns, validated against RequestRecord (they are spliced into SQL)."""
    unknown = [c for c in columns if c not in RECORD_FIELDS]
    if unknown:
        raise StoreError(f"unknown record column(s): {', '.join(unknown)}")
    if not columns:
        raise StoreError("read_arrays needs at least one column")
    return tuple(columns)


def _dtype(column: str) -> type[Any]:
    if column in BOOL_COLUMNS:
        return np.bool_
    if column in TEXT_COLUMNS:
        return object
    return np.float64


def empty_arrays(columns: Sequence[str]) -> ArmArrays:
    return {c: np.empty(0, dtype=_dtype(c)) for c in columns}


def rows_to_arrays(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> ArmArrays:
    """Rows (tuples in `columns` order) -> one array per column."""
    if not rows:
        return empty_arrays(columns)
    table = np.empty((len(rows), len(columns)), dtype=object)
    table[:] = rows
    out: ArmArrays = {}
    for i, column in enumerate(columns):
        values = table[:, i]
        dtype = _dtype(column)
        if dtype is object:
            out[column] = values.copy()
        elif dtype is np.bool_:
            out[column] = values.astype(np.bool_)
        else:
            out[column] = values.astype(np.float64)
    return out


def arrow_to_arrays(columns: Sequence[str], table: Any) -> ArmArrays:
    """A `pyarrow.Table` whose columns are `columns`, in order -> one array per column.

    Column types are whatever the reader inferred (SQLite through ADBC types an all-NULL column as
    int64), so every column is cast to the type the contract promises before leaving Arrow.
    Arrays are always writable, like those of `rows_to_arrays` (Arrow hands out read-only views).
    """
    import pyarrow as pa  # a runtime dependency, imported here so the sqlite3 path never needs it

    if table.num_rows == 0:
        return empty_arrays(columns)
    out: ArmArrays = {}
    for i, column in enumerate(columns):
        values = table.column(i)
        dtype = _dtype(column)
        if dtype is object:
            array = values.cast(pa.string()).to_numpy(zero_copy_only=False)
        elif dtype is np.bool_:
            array = values.cast(pa.bool_()).fill_null(False).to_numpy(zero_copy_only=False)
        else:
            array = values.cast(pa.float64()).to_numpy(zero_copy_only=False)
        if not array.flags.writeable:
            array = array.copy()
        out[column] = array
    return out
