"""Turning fetched rows into the column arrays of `ArmArrays`, shared by every backend.

The conversion is the hot part of a 1M-row read, so it stays in numpy's C loops: the rows become
one 2-D object array, and each column is cast from there (None becomes NaN in float columns).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specproxy.errors import StoreError
from specproxy.records import RECORD_FIELDS
from specproxy.store.base import ArmArrays

__all__ = ["BOOL_COLUMNS", "TEXT_COLUMNS", "check_columns", "empty_arrays", "rows_to_arrays"]

BOOL_COLUMNS = frozenset({"stream", "shadow", "disconnected"})
TEXT_COLUMNS = frozenset(
    {"request_id", "run_id", "arm", "model", "endpoint", "pair_id", "error_kind"}
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
