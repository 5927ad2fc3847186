"""Request rows as the store returns them, as column arrays (`summary.rows`)."""

from __future__ import annotations

import math

import numpy as np

from specproxy.summary.rows import empty_arrays, records_to_arrays, rows_to_arrays


def test_each_column_gets_its_kind_of_array() -> None:
    columns = ("t_start", "ttft_s", "shadow", "model", "status")
    rows = [(1.0, None, False, "m", 200), (2.0, 0.25, True, "n", 500)]
    arrays = rows_to_arrays(columns, rows)
    assert arrays["t_start"].dtype == arrays["ttft_s"].dtype == arrays["status"].dtype == np.float64
    assert math.isnan(arrays["ttft_s"][0]) and arrays["ttft_s"][1] == 0.25
    assert arrays["shadow"].dtype == np.bool_ and arrays["shadow"].tolist() == [False, True]
    assert arrays["model"].dtype == object and arrays["model"].tolist() == ["m", "n"]
    assert {c: a.dtype for c, a in empty_arrays(columns).items()} == {
        c: a.dtype for c, a in arrays.items()
    }


def test_every_arm_is_present() -> None:
    arrays = records_to_arrays(("t_start",), {"baseline": [(1.0,)]})
    assert arrays["baseline"]["t_start"].tolist() == [1.0]
    assert arrays["speculative"]["t_start"].size == 0
