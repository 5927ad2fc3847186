"""The rows the stats job reads: which ones count as usable."""

from __future__ import annotations

import numpy as np

from specproxy.stats.job.rows import ROW_READ, usable_mask


def test_rerouted_rows_are_not_usable() -> None:
    assert "rerouted_from" in ROW_READ  # the job and the report read the flag with the rows
    arrays = {
        "t_start": np.array([1.0, 2.0, 3.0]),
        "status": np.array([200, 200, 502]),
        "error_kind": np.array([None, None, "connect"], dtype=object),
        "disconnected": np.array([False, False, False]),
        "rerouted_from": np.array([None, "speculative", None], dtype=object),
    }
    assert usable_mask(arrays).tolist() == [True, False, False]
