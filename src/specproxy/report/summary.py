"""What the demo's terminal view and the report show from one stats result, formatted once.

The stats job's JSON is the single source of the headline numbers; this module picks the window
to show (the whole run) and turns it into rows of strings. The live page (`ui/app.js`) applies
the same choices and the same formats, so the three views print identical numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "ARMS",
    "METRICS",
    "STATISTICS",
    "arm_rows",
    "diagnosis_lines",
    "fmt_ci",
    "fmt_ms",
    "fmt_ratio",
    "main_window",
    "speedup_rows",
    "verdict_rows",
]

ARMS = ("speculative", "baseline")
METRICS = {"e2e": "E2E", "ttft": "TTFT", "tpot": "TPOT"}
STATISTICS = ("median", "mean", "p90", "p99")


def main_window(result: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The comparison to show: all models together over the whole run (`results.all.all`).

    Falls back to the longest window when the job was configured without a whole-run window.
    """
    if not result:
        return None
    results = result.get("results")
    if not isinstance(results, Mapping) or not results:
        return None
    per_window = results.get("all") or results[sorted(results)[0]]
    if not isinstance(per_window, Mapping) or not per_window:
        return None
    key = "all" if "all" in per_window else max(per_window, key=_window_seconds(per_window))
    chosen = per_window[key]
    return chosen if isinstance(chosen, Mapping) else None


def arm_rows(result: Mapping[str, Any] | None) -> list[tuple[str, ...]]:
    """(arm, n, E2E p50, E2E p99, TTFT p50, TPOT p50, acceptance) per arm."""
    window = main_window(result)
    if window is None:
        return []
    metrics = window["metrics"]
    rows: list[tuple[str, ...]] = []
    for arm in ARMS:
        e2e = metrics["e2e"]["summary"].get(arm, {})
        engine = (window.get("engine") or {}).get(arm) or {}
        acceptance = engine.get("acceptance_rate")
        rows.append(
            (
                arm,
                str(metrics["e2e"]["n"].get(arm, 0)),
                fmt_ms(e2e.get("median")),
                fmt_ms(e2e.get("p99")),
                fmt_ms(metrics["ttft"]["summary"].get(arm, {}).get("median")),
                fmt_ms(metrics["tpot"]["summary"].get(arm, {}).get("median")),
                f"{acceptance:.1%}" if isinstance(acceptance, (int, float)) else "-",
            )
        )
    return rows


def speedup_rows(
    result: Mapping[str, Any] | None, statistics: tuple[str, ...] = ("median", "p99")
) -> list[tuple[str, str, str, str]]:
    """(metric, statistic, estimate, CI) for each metric and statistic."""
    window = main_window(result)
    if window is None:
        return []
    rows = []
    for metric, label in METRICS.items():
        block = window["metrics"][metric]["speedup"]
        for stat in statistics:
            s = block.get(stat) or {}
            if s.get("status") == "ok":
                rows.append((label, stat, fmt_ratio(s.get("estimate")), fmt_ci(s)))
            else:
                needed = max((s.get("n_needed") or {"": 0}).values())
                rows.append((label, stat, "-", f"needs {needed} more per arm"))
    return rows


def verdict_rows(result: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(metric, verdict) from the anytime-valid tests."""
    window = main_window(result)
    if window is None:
        return []
    return [(label, str(window["metrics"][m].get("verdict"))) for m, label in METRICS.items()]


def diagnosis_lines(result: Mapping[str, Any] | None) -> list[str]:
    window = main_window(result)
    if window is None:
        return []
    diagnosis = window.get("diagnosis") or {}
    lines = [f"diagnosis: {diagnosis.get('summary', '-')}"]
    lines += [f"  - {r['message']}" for r in diagnosis.get("reasons", [])]
    return lines


def fmt_ms(seconds: Any) -> str:
    return f"{seconds * 1e3:.1f} ms" if isinstance(seconds, (int, float)) else "-"


def fmt_ratio(value: Any) -> str:
    return f"{value:.3f}x" if isinstance(value, (int, float)) else "-"


def fmt_ci(block: Mapping[str, Any]) -> str:
    lower, upper = block.get("lower"), block.get("upper")
    if not isinstance(lower, (int, float)) or not isinstance(upper, (int, float)):
        return "-"
    return f"[{lower:.3f}, {upper:.3f}]"


def _window_seconds(per_window: Mapping[str, Any]) -> Any:
    def seconds(key: str) -> float:
        value = (per_window.get(key) or {}).get("window_s")
        return float(value) if isinstance(value, (int, float)) else float("inf")

    return seconds
