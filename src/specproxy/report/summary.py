"""What the demo's terminal view and the report show from one stats result, formatted once.

The stats job's JSON is the single source of the headline numbers; this module picks the window
to show (the whole run) and turns it into rows of strings. The live page (`ui/app.js`) applies
the same choices and the same formats, so the three views print identical numbers.

A/B/n (schema 3): the window's own fields are the control against the first treatment;
`arms_of` names the control and every treatment, `comparison_of` gives each treatment's
comparison, `best_line` the best-configuration answer and `crossover_text` / `condition_rows`
a treatment's speedups by condition. Results stored before schema 3 read as the two-arm
shorthand ("baseline" against "speculative").
"""

from __future__ import annotations

from typing import Any

from specproxy.records import SHORTHAND_CONTROL
from specproxy.stats import result as schema
from specproxy.stats.result import (
    STATISTICS,
    Conditions,
    CrossoverResult,
    StatsResult,
    WindowComparison,
    WindowResult,
    comparisons_of,
)

__all__ = [
    "ARMS",
    "METRICS",
    "STATISTICS",
    "arm_comparison",
    "arm_figures",
    "arm_labels_text",
    "arm_rows",
    "arms_of",
    "band_text",
    "best_line",
    "comparison_of",
    "condition_rows",
    "conditions_of",
    "crossover_text",
    "diagnosis_lines",
    "fmt_ci",
    "fmt_ms",
    "fmt_ratio",
    "main_window",
    "needed_more",
    "shown_arms",
    "speedup_rows",
    "treatments_of",
    "verdict_rows",
]

ARMS = ("speculative", "baseline")  # the two-arm shorthand, in the order the views list them
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


def arms_of(window: WindowResult) -> tuple[str, list[str]]:
    """(control, treatments) of a window: its `control` and `treatments` (schema 3), else the
    shorthand control and the one treatment of its comparison."""
    control = window.get("control", SHORTHAND_CONTROL)
    treatments = window.get("treatments") or list(comparisons_of(window))
    return control, list(treatments)


def shown_arms(window: WindowResult) -> list[str]:
    """Every arm in the order the views list them: the treatments, then the control (two arms:
    "speculative", "baseline")."""
    control, treatments = arms_of(window)
    return [*treatments, control]


def comparison_of(window: WindowResult, treatment: str) -> WindowComparison:
    """One treatment's comparison with the control (the first treatment's is the window's)."""
    return comparisons_of(window).get(treatment, window)


def conditions_of(window: WindowResult, treatment: str) -> Conditions | None:
    """A treatment's speedups by condition and crossover (None: the window has none)."""
    many = window.get("comparisons") or {}
    if treatment in many:
        return many[treatment].get("conditions")
    return window.get("conditions")


def treatments_of(result: StatsResult | None) -> list[str]:
    """Every treatment of the shown window, in configured order (one for a two-arm result)."""
    window = main_window(result)
    return arms_of(window)[1] if window is not None else []


def _comparison(window: WindowResult, treatment: str | None) -> WindowComparison:
    """The treatment's comparison with the control (None: the window's own, the first's)."""
    return window if treatment is None else comparison_of(window, treatment)


def arm_comparison(window: WindowResult, arm: str) -> WindowComparison:
    """The comparison an arm's own figures are read from: a treatment's, the control's from the
    first treatment's (the window itself)."""
    control, _ = arms_of(window)
    return window if arm == control else comparison_of(window, arm)


def arm_rows(result: StatsResult | None) -> list[tuple[str, ...]]:
    """(arm, n, E2E p50, E2E p99, TTFT p50, TPOT p50, acceptance) per arm (`shown_arms`)."""
    window = main_window(result)
    if window is None:
        return []
    rows: list[tuple[str, ...]] = []
    for arm in shown_arms(window):
        held = arm_comparison(window, arm)
        metrics = held["metrics"]
        e2e = metrics["e2e"]["summary"].get(arm, {})
        engine = held["engine"].get(arm)
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


def arm_figures(window: WindowResult, arm: str) -> dict[str, Any]:
    """One arm's raw figures as the per-arm tables show them (n, E2E median/P90/P99, TTFT and
    TPOT medians, acceptance rate and length), read from the comparison holding the arm."""
    held = arm_comparison(window, arm)
    metrics = held["metrics"]
    e2e = metrics["e2e"]["summary"].get(arm, {})
    engine = held["engine"].get(arm)
    return {
        "n": metrics["e2e"]["n"].get(arm, 0),
        "e2e_median": e2e.get("median"),
        "e2e_p90": e2e.get("p90"),
        "e2e_p99": e2e.get("p99"),
        "ttft_median": metrics["ttft"]["summary"].get(arm, {}).get("median"),
        "tpot_median": metrics["tpot"]["summary"].get(arm, {}).get("median"),
        "acceptance_rate": engine["acceptance_rate"] if engine is not None else None,
        "mean_acceptance_length": engine["mean_acceptance_length"] if engine is not None else None,
    }


def arm_labels_text(result: StatsResult | None, arm: str) -> str:
    """An arm's configured labels as the views print them beside its name ("method=ngram,
    k=4"); "" for an arm without labels (the two-arm shorthand's never have any)."""
    labels = result.get("arm_labels", {}).get(arm, {}) if result is not None else {}
    return ", ".join(f"{key}={value}" for key, value in labels.items())


def best_line(window: WindowResult) -> str | None:
    """The best-configuration answer in one line; None with one treatment (its comparison is
    the answer) or in results without one. `best["reason"]` says why in words."""
    best = window.get("best")
    if best is None or best["state"] == "single":
        return None
    control, _ = arms_of(window)
    leader, runner_up = best["leader"], best["runner_up"]
    if leader is None or runner_up is None:
        return f"no winner yet: {best['reason']}"
    margin = best["margin"]
    over = f"{fmt_ratio(margin['estimate'])} {fmt_ci(margin)}" if margin is not None else "-"
    speedup = fmt_ratio(best["speedups"].get(leader))
    if best["state"] == "winner":
        head = f"best: {leader}, {speedup} over {control}"
    else:
        head = f"no winner yet: {leader} leads, {speedup} over {control}"
    return f"{head}; {over} over the runner-up {runner_up}"


def _load(x: float | None) -> str:
    return f"{x:.1f}" if isinstance(x, (int, float)) else "-"


def crossover_text(found: CrossoverResult) -> str:
    """Where a treatment's speedup crosses 1 against load, in the views' numbers."""
    status, seen = found["status"], found["observed"]
    span = f" ({_load(seen[0])}-{_load(seen[1])})" if seen else ""
    if status == "helps_throughout":
        return f"helps at every load observed{span}"
    if status == "costs_throughout":
        return f"costs at every load observed{span}"
    if status != "ok":
        return "too little data"
    return (
        f"crosses 1 at load {_load(found['load'])} [{_load(found['lower'])}, "
        f"{_load(found['upper'])}]: {fmt_ratio(found['speedup_below'])} below, "
        f"{fmt_ratio(found['speedup_above'])} above"
    )


def condition_rows(
    conditions: Conditions,
) -> list[tuple[str, str, dict[str, schema.BandSpeedup]]]:
    """(dimension, band, {metric: its band}) per band of every condition, in the result's order
    (each metric's bands are the same bands)."""
    rows: list[tuple[str, str, dict[str, schema.BandSpeedup]]] = []
    for dim, per_metric in conditions["segments"].items():
        bands: dict[str, dict[str, schema.BandSpeedup]] = {}
        for metric, found in per_metric.items():
            for band in found:
                bands.setdefault(band["band"], {})[metric] = band
        rows += [(dim, band, cells) for band, cells in bands.items()]
    return rows


def band_text(band: schema.BandSpeedup | None) -> tuple[str, str]:
    """(estimate, CI) of one band as the views print it; "too little data" below the minimum."""
    if band is None or band["status"] != "ok":
        return "-", "too little data"
    interval: schema.Interval = {
        "estimate": band["speedup"],
        "lower": band["lower"],
        "upper": band["upper"],
    }
    return fmt_ratio(band["speedup"]), fmt_ci(interval)


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
