"""The /ui charts' series: stats-job results over time, reduced to what the charts draw.

Pure: rows (time, result) in, small JSON points out. Each point is the main window of one
result (`report.summary.main_window`, the one the page's tables show): per metric the median
and P99 speedups with their CI bounds, and per arm the median and P99 latency. At most `limit`
points, evenly thinned, the newest always kept, so a long run stays a small response.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from specproxy.report.summary import ARMS, METRICS, main_window
from specproxy.stats.result import StatsResult

__all__ = ["CHART_STATISTICS", "MAX_POINTS", "chart_points"]

CHART_STATISTICS = ("median", "p99")
MAX_POINTS = 720


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and value == value else None


def _point(t: float, window: Mapping[str, Any]) -> dict[str, Any]:
    speedup: dict[str, dict[str, list[float | None] | None]] = {}
    latency: dict[str, dict[str, dict[str, float | None]]] = {}
    for metric in METRICS:
        block = window.get("metrics", {}).get(metric) or {}
        speedup[metric] = {}
        for stat in CHART_STATISTICS:
            ci = (block.get("speedup") or {}).get(stat) or {}
            bounds = [_number(ci.get(k)) for k in ("estimate", "lower", "upper")]
            ok = ci.get("status") == "ok" and None not in bounds
            speedup[metric][stat] = bounds if ok else None
        summary = block.get("summary") or {}
        latency[metric] = {
            arm: {stat: _number((summary.get(arm) or {}).get(stat)) for stat in CHART_STATISTICS}
            for arm in ARMS
        }
    return {
        "t": t,
        "design": window.get("design"),
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
