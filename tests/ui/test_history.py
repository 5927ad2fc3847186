"""The /ui charts' points (`ui.history.chart_points`): one per stored result, thin and bounded."""

from __future__ import annotations

from typing import Any

from specproxy.ui.history import chart_points


def result(speedup: float, *, p99_ok: bool = False) -> dict[str, Any]:
    ok = {"status": "ok", "estimate": speedup, "lower": speedup - 0.1, "upper": speedup + 0.1}
    short = {"status": "insufficient", "estimate": None, "n_needed": {"baseline": 9}}
    window = {
        "design": "split",
        "samples": {"baseline": 10, "speculative": 12},
        "metrics": {
            m: {
                "speedup": {"median": ok, "p99": ok if p99_ok else short},
                "summary": {
                    "baseline": {"median": 0.2, "p99": 0.5},
                    "speculative": {"median": 0.1, "p99": None},
                },
            }
            for m in ("e2e", "ttft", "tpot")
        },
    }
    return {"results": {"all": {"all": window}}}


def test_points_carry_speedup_bounds_and_latency_per_arm() -> None:
    (point,) = chart_points([(100.0, result(2.0))])
    assert point["t"] == 100.0 and point["design"] == "split"
    assert point["speedup"]["e2e"]["median"] == [2.0, 1.9, 2.1]
    assert point["speedup"]["e2e"]["p99"] is None  # no CI yet: nothing drawn, never a 0
    assert point["latency"]["tpot"]["baseline"] == {"median": 0.2, "p99": 0.5}
    assert point["latency"]["tpot"]["speculative"] == {"median": 0.1, "p99": None}
    assert point["samples"] == {"baseline": 10, "speculative": 12}


def test_results_without_a_comparison_are_skipped() -> None:
    rows = [(1.0, {"results": {}}), (2.0, result(1.5, p99_ok=True))]
    assert [p["t"] for p in chart_points(rows)] == [2.0]


def test_long_histories_are_thinned_keeping_the_newest() -> None:
    rows = [(float(t), result(1.0 + t / 1000)) for t in range(1000)]
    points = chart_points(rows, limit=50)
    times = [p["t"] for p in points]
    assert len(points) == 50 and times[-1] == 999.0 and times[0] == 0.0
    assert times == sorted(times)
