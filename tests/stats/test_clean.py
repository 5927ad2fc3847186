from __future__ import annotations

import numpy as np

from specproxy.stats.clean import count_outliers, warmup_mask


def test_warmup_excludes_first_requests_after_start_and_each_restart() -> None:
    t = np.arange(20, dtype=np.float64)
    mask = warmup_mask(t, [10.5], warmup_requests=3, restart_requests=2)
    assert np.flatnonzero(mask).tolist() == [0, 1, 2, 11, 12]


def test_warmup_seconds_after_restart() -> None:
    t = np.arange(20, dtype=np.float64)
    mask = warmup_mask(t, [5.0], warmup_requests=0, restart_requests=1, restart_seconds=3.5)
    assert np.flatnonzero(mask).tolist() == [5, 6, 7, 8]


def test_outliers_are_counted_with_log_iqr_fences() -> None:
    x = np.concatenate([np.full(50, 1.0), np.full(50, 2.0), [100.0, 0.001]])
    out = count_outliers(x)
    assert out.count == 2
    assert out.fraction == 2 / 102
    assert out.low_fence < 1.0 < 2.0 < out.high_fence < 100.0
    assert count_outliers(np.ones(3)).count == 0
