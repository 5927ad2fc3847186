"""What the demo's terminal view and the report show from one stats result, formatted once.

The stats job's JSON is the single source of the headline numbers; this module picks the window
to show (the whole run) and turns it into rows of strings. The live page (`ui/app.js`) applies
the same choices and the same formats, so the three views print identical numbers.

With more than one treatment (A/B/n, schema 3) the window's own comparison fields are the first
treatment's; `treatments_of` lists them all, the rows take a `treatment`, and `best_line` says
which one leads.
"""

from __future__ import annotations

from typing import Any

from specproxy.stats import result as schema
from specproxy.stats.result import (
    STATISTICS,
    StatsResult,
    WindowComparison,
    WindowResult,
    comparisons_of,
)

__all__ = [
    "ARMS",
    "METRICS",
    "STATISTICS",
    "arm_rows",
    "best_line",
    "diagnosis_lines",
    "fmt_ci",
    "fmt_ms",
    "fmt_ratio",
    "main_window",
    "needed_more",
    "speedup_rows",
    "treatments_of",
    "verdict_rows",
]

ARMS = ("speculative", "baseline")
# metric -> label, and STATISTICS, both from the result's one declaration (`stats.result`)
METRICS: dict[str, str] = {name: spec.label for name, spec in schema.METRICS.items()}


def main_window(result: StatsResult | None) -> WindowResult | None:
    """The comparison to show: all models together over the whole run (`results.all.all`).

    Falls back to the longest window when the job was configured without a whole-run window.
    """
    if not result or not result["results"]:
        return None
    results = result["results"]
    per_window = results.get("all") or results[sorted(results)[0]]
    if not per_window:
        return None
    if "all" in per_window:
        return per_window["all"]
    return max(per_window.values(), key=_window_seconds)


def treatments_of(result: StatsResult | None) -> list[str]:
    """Every treatment of the shown window, in configured order (one for a two-arm result)."""
    window = main_window(result)
    return list(comparisons_of(window)) if window is not None else []


def _comparison(window: WindowResult, treatment: str | None) -> WindowComparison:
    """The treatment's comparison with the control (None: the window's own, the first's)."""
    if treatment is None:
        return window
    return comparisons_of(window).get(treatment, window)


def arm_rows(result: StatsResult | None) -> list[tuple[str, ...]]:
    """(arm, n, E2E p50, E2E p99, TTFT p50, TPOT p50, acceptance) per arm: the treatments,
    then the control (speculative, baseline for the two-arm shorthand)."""
    window = main_window(result)
    if window is None:
        return []
    rows: list[tuple[str, ...]] = []
    control = window.get("control")  # absent before schema 3: the shorthand's arms
    many = comparisons_of(window) if control is not None else {}
    arms = (*many, control) if control is not None else ARMS
    for arm in arms:
        comparison = many.get(arm, window)
        metrics = comparison["metrics"]
        e2e = metrics["e2e"]["summary"].get(arm, {})
        engine = comparison["engine"].get(arm)
        acceptance = engine["acceptance_rate"] if engine is not None else None
        rows.append(
            (
                arm,
                str(metrics["e2e"]["n"].get(arm, 0)),
                fmt_ms(e2e.get("median")),
                fmt_ms(e2e.get("p99")),
                fmt_ms(metrics["ttft"]["summary"].get(arm, {}).get("median")),
                fmt_ms(metrics["tpot"]["summary"].get(arm, {}).get("median")),
                f"{acceptance:.1%}" if acceptance is not None else "-",
            )
        )
    return rows


def speedup_rows(
    result: StatsResult | None,
    statistics: tuple[str, ...] = ("median", "p99"),
    treatment: str | None = None,
) -> list[tuple[str, str, str, str]]:
    """(metric, statistic, estimate, CI) for each metric and statistic, of `treatment`'s
    comparison (None: the first treatment's)."""
    window = main_window(result)
    if window is None:
        return []
    comparison = _comparison(window, treatment)
    rows = []
    for metric, label in METRICS.items():
        block = comparison["metrics"][metric]["speedup"]
        for stat in statistics:
            s = block.get(stat)
            if s is not None and s["status"] == "ok":
                rows.append((label, stat, fmt_ratio(s["estimate"]), fmt_ci(s)))
            else:
                rows.append((label, stat, "-", f"needs {needed_more(s)} more per arm"))
    return rows


def needed_more(speedup: schema.Speedup | None) -> int:
    """The most samples an arm still needs for a statistic (0 when unknown)."""
    return max(speedup["n_needed"].values(), default=0) if speedup is not None else 0


def verdict_rows(result: StatsResult | None, treatment: str | None = None) -> list[tuple[str, str]]:
    """(metric, verdict) from the anytime-valid tests, of `treatment` (None: the first)."""
    window = main_window(result)
    if window is None:
        return []
    comparison = _comparison(window, treatment)
    return [(label, comparison["metrics"][m]["verdict"]) for m, label in METRICS.items()]


def best_line(result: StatsResult | None) -> str | None:
    """Which treatment leads (`WindowResult.best`), in one line; None with one treatment."""
    window = main_window(result)
    best = window.get("best") if window is not None else None
    if best is None or best["state"] == "single":
        return None
    leader, speedups = best["leader"], best["speedups"]
    if leader is None:
        return f"best: none yet ({best['reason']})"
    metric = f"{METRICS.get(best['metric'], best['metric'])} {best['statistic']}"
    others = [t for t in speedups if t != leader]
    figures = " vs ".join(fmt_ratio(speedups[t]) for t in (leader, *others))
    if best["state"] == "winner":
        return f"best: {leader}, shown faster than {', '.join(others)} ({metric} {figures})"
    pending = [t for t in others if t not in best["separated_from"]]
    return (
        f"best: none yet; {leader} leads ({metric} {figures}), not yet separated from "
        + ", ".join(pending)
    )


def diagnosis_lines(result: StatsResult | None) -> list[str]:
    window = main_window(result)
    if window is None:
        return []
    diagnosis = window["diagnosis"]
    lines = [f"diagnosis: {diagnosis['summary']}"]
    lines += [f"  - {r['message']}" for r in diagnosis["reasons"]]
    return lines


def fmt_ms(seconds: Any) -> str:
    return f"{seconds * 1e3:.1f} ms" if isinstance(seconds, (int, float)) else "-"


def fmt_ratio(value: Any) -> str:
    return f"{value:.3f}x" if isinstance(value, (int, float)) else "-"


def fmt_ci(block: schema.Interval) -> str:
    lower, upper = block["lower"], block["upper"]
    if lower is None or upper is None:
        return "-"
    return f"[{lower:.3f}, {upper:.3f}]"


def _window_seconds(window: WindowResult) -> float:
    seconds = window["window_s"]
    return float(seconds) if seconds is not None else float("inf")
