"""Fine bins as the store packs them, unpacked for the statistics (`summary.packed`)."""

from __future__ import annotations

import numpy as np
import pytest

from specproxy.summary.packed import fine_bins_arrays


def test_packed_fine_bins_unpack_in_bin_order() -> None:
    """Every backend's packing (SQLite text, PostgreSQL big-endian bytes, memory lists) gives the
    same arrays, sorted by bin with each count kept beside its bin."""
    bins, counts = [5, -3, 7, 0], [2, 9, 1, 4]
    want = ([-3, 0, 5, 7], [9, 4, 2, 1])
    text = fine_bins_arrays(",".join(map(str, bins)), ",".join(map(str, counts)))
    raw = fine_bins_arrays(
        np.array(bins, dtype=">i4").tobytes(), np.array(counts, dtype=">i8").tobytes()
    )
    for b, c in (text, raw, fine_bins_arrays(bins, counts)):
        assert (b.tolist(), c.tolist()) == want
        assert b.dtype == c.dtype == np.int64
    with pytest.raises(ValueError):
        fine_bins_arrays("1,2", "3")
    with pytest.raises(TypeError):
        fine_bins_arrays("1", b"\x00" * 8)
    with pytest.raises(TypeError):
        fine_bins_arrays([1], "1")
