"""Report figures: readable log ticks, the P50/P99 legend, seconds for short runs."""

from __future__ import annotations

import numpy as np

from specproxy.report.figures import latency_cdf_png, log_ticks, speedup_over_time_png, time_axis


def test_log_ticks_are_plain_1_2_5_numbers() -> None:
    assert log_ticks(15.0, 120.0) == [20.0, 50.0, 100.0]
    assert log_ticks(0.8, 2500.0) == [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000]
    assert log_ticks(22.0, 48.0) == [30.0, 40.0]  # a narrow range: finer, still plain
    assert log_ticks(0.0, 1.0) == []


def test_short_runs_read_in_seconds_long_ones_in_minutes() -> None:
    x, label = time_axis([100.0, 130.0, 160.0])
    assert label.startswith("seconds") and x.tolist() == [0.0, 30.0, 60.0]
    x, label = time_axis([0.0, 600.0, 1200.0])
    assert label.startswith("minutes") and x.tolist() == [0.0, 10.0, 20.0]


def test_figures_render_to_png() -> None:
    rng = np.random.default_rng(0)
    series = {
        "speculative": rng.lognormal(np.log(0.05), 0.3, 200),
        "baseline": rng.lognormal(np.log(0.1), 0.3, 200),
    }
    assert latency_cdf_png(series, title="E2E", xlabel="E2E").startswith(b"\x89PNG")
    png = speedup_over_time_png(
        [0, 5, 10], [2, 2.1, 2.0], [1.8, 1.9, 1.9], [2.2, 2.3, 2.1], title="x"
    )
    assert png.startswith(b"\x89PNG")
