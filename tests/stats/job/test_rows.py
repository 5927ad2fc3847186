"""The rows the stats job reads: which ones count as usable."""

from __future__ import annotations

from typing import Any

import numpy as np

from specproxy.stats.job.rows import ROW_READ, Rows, usable_mask


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


def test_rows_after_the_limit_are_cut_and_the_primary_ones_counted() -> None:
    """`Rows.until`: rows stamped after the limit leave every column; the primary ones are
    counted and the newest of them given (a shadow copy is not a request of the comparison)."""

    def arm(t: list[float], shadow: list[bool]) -> dict[str, Any]:
        return {
            "t_start": np.array(t),
            "shadow": np.array(shadow),
            "model": np.array(["m"] * len(t), dtype=object),
        }

    rows = Rows(
        {
            "baseline": arm([10.0, 20.0, 10_820.0, 10_900.0], [False, False, False, True]),
            "speculative": arm([11.0, 10_830.0], [False, False]),
        }
    )
    kept, future, newest = rows.until(25.0)
    assert future == 2 and newest == 10_830.0  # the shadow row at 10,900 goes uncounted
    assert kept.arrays["baseline"]["t_start"].tolist() == [10.0, 20.0]
    assert kept.arrays["baseline"]["model"].tolist() == ["m", "m"]
    assert kept.arrays["speculative"]["t_start"].tolist() == [11.0]
    assert kept.span() == (10.0, 20.0)
    assert rows.until(25.0 + 20_000)[1:] == (0, None)
