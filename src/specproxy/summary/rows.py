"""Request rows as the store returns them (`read_records`: tuples per arm) as column arrays.

Numeric columns become float64 (None -> NaN), booleans bool arrays, strings (model, pair_id,
...) object arrays: the shape the statistics and the report work on (`ArmArrays`). The
conversion stays in C loops: the rows become one 2-D object array, each column is cast from it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.records import (
    BOOL_COLUMNS,
    SHORTHAND_CONTROL,
    SHORTHAND_TREATMENT,
    TEXT_COLUMNS,
    Arm,
)

__all__ = ["ArmArrays", "empty_arrays", "records_to_arrays", "rows_to_arrays"]

# column name -> values, one entry per record, in t_start order
ArmArrays = dict[str, npt.NDArray[Any]]


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


def records_to_arrays(
    columns: Sequence[str],
    records: Mapping[Arm, Sequence[Sequence[Any]]],
    arms: Iterable[Arm] = (SHORTHAND_CONTROL, SHORTHAND_TREATMENT),
) -> dict[Arm, ArmArrays]:
    """`read_records`' answer as arrays, every arm of it and of `arms` present (an arm without
    rows: empty)."""
    return {arm: rows_to_arrays(columns, records.get(arm, ())) for arm in sorted({*records, *arms})}
