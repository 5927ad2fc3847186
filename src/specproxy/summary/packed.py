"""Fine bins as the store returns them (`TierRead.bins`), unpacked into arrays for the statistics.

The SQL backends pack one (minute, model, arm)'s bins and counts into one row each (SQLite:
comma-separated text; PostgreSQL: big-endian int4 bins and int8 counts), the memory backend
hands plain lists; `fine_bins_arrays` turns any of them into int64 arrays in ascending bin order.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["fine_bins_arrays"]

IntArray = npt.NDArray[np.int64]


def fine_bins_arrays(
    bins: str | bytes | Sequence[int], counts: str | bytes | Sequence[int]
) -> tuple[IntArray, IntArray]:
    """(bins, counts) arrays in ascending bin order, each count beside its bin."""
    if isinstance(bins, str) and isinstance(counts, str):
        b = np.fromstring(bins, dtype=np.int64, sep=",")
        c = np.fromstring(counts, dtype=np.int64, sep=",")
    elif isinstance(bins, bytes) and isinstance(counts, bytes):
        b = np.frombuffer(bins, dtype=">i4").astype(np.int64)
        c = np.frombuffer(counts, dtype=">i8").astype(np.int64)
    elif not isinstance(bins, str | bytes) and not isinstance(counts, str | bytes):
        b = np.asarray(bins, dtype=np.int64).reshape(-1)
        c = np.asarray(counts, dtype=np.int64).reshape(-1)
    else:
        raise TypeError("packed fine bins and counts must be packed alike")
    if b.size != c.size:
        raise ValueError("packed fine bins and counts differ in length")
    if b.size > 1 and not bool(np.all(b[1:] > b[:-1])):
        order = np.argsort(b, kind="stable")
        b, c = b[order], c[order]
    return b, c
