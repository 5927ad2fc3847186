"""The /ui charts' series: stats-job results over time, reduced to what the charts draw.

Pure: rows (time, result) in, small JSON points out. Each point is the main window of one
result (`report.summary.main_window`, the one the page's tables show): per metric the median
and P99 speedups of the first treatment with their CI bounds, and per arm (every arm of the
result, treatments first and the control last: `summary.shown_arms`) the median and P99
latency. At most `limit` points, evenly thinned, the newest always kept, so a long run stays a
small response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from specproxy.report.summary import METRICS, arm_comparison, arms_of, main_window, shown_arms
from specproxy.stats.result import StatsResult, WindowResult

__all__ = ["CHART_STATISTICS", "MAX_POINTS", "chart_points"]

CHART_STATISTICS = ("median", "p99")
MAX_POINTS = 720


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value else None


def _point(t: float, window: WindowResult) -> dict[str, Any]:
    arms = shown_arms(window)
    held: Mapping[str, Any] = {
        arm: arm_comparison(window, arm).get("metrics") or {} for arm in arms
    }
    speedup: dict[str, dict[str, list[float | None] | None]] = {}
    latency: dict[str, dict[str, dict[str, float | None]]] = {}
    for metric in METRICS:
        block: Mapping[str, Any] = (window.get("metrics") or {}).get(metric) or {}
        speedup[metric] = {}
        for stat in CHART_STATISTICS:
            ci = (block.get("speedup") or {}).get(stat) or {}
            bounds = [_number(ci.get(k)) for k in ("estimate", "lower", "upper")]
            ok = ci.get("status") == "ok" and None not in bounds
            speedup[metric][stat] = bounds if ok else None
        latency[metric] = {}
        for arm in arms:
            summary = ((held[arm].get(metric) or {}).get("summary") or {}).get(arm) or {}
            latency[metric][arm] = {stat: _number(summary.get(stat)) for stat in CHART_STATISTICS}
    control, treatments = arms_of(window)
    return {
        "t": t,
        "design": window.get("design"),
        "ratio": [control, treatments[0]],  # the speedups': control / first treatment
        "samples": dict(window.get("samples") or {}),
        "speedup": speedup,
        "latency": latency,
    }


def chart_points(
    rows: Sequence[tuple[float, Mapping[str, Any]]], limit: int = MAX_POINTS
) -> list[dict[str, Any]]:
    """One point per stored result that has a comparison, oldest first, at most `limit`."""
    points = []
    for t, result in rows:
        window = main_window(cast(StatsResult, result))  # stored by the stats job
        if window is not None:
            points.append(_point(float(t), window))
    if len(points) <= limit:
        return points
    step = len(points) / limit
    kept = [points[int(i * step)] for i in range(limit - 1)]
    return [*kept, points[-1]]
