"""The report's figures, drawn with matplotlib from plain arrays into PNG bytes.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas directly, never through
pyplot: no global figure state, no GUI backend, safe in a worker thread. Each arm keeps the same
colour in every figure (speculative blue, baseline orange).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator

__all__ = [
    "ARM_COLOURS",
    "acceptance_png",
    "arm_colour",
    "latency_cdf_png",
    "log_ticks",
    "speedup_over_time_png",
    "speedup_vs_load_png",
    "time_axis",
]

ARM_COLOURS = {"speculative": "#1f6fb4", "baseline": "#e07b1a"}
# A/B/n arms with other names: one colour each, by their place among the figure's arms
_PALETTE = ("#1f6fb4", "#e07b1a", "#2ca02c", "#9467bd", "#d62728", "#17becf", "#8c564b", "#7f7f7f")


def arm_colour(arm: str, arms: Sequence[str]) -> str:
    """An arm's colour: the shorthand's own, else the palette's by its place in `arms`."""
    if arm in ARM_COLOURS:
        return ARM_COLOURS[arm]
    return _PALETTE[arms.index(arm) % len(_PALETTE)] if arm in arms else "#444444"


_DPI = 110
_SIZE = (6.4, 3.6)

FloatArray = npt.NDArray[np.float64]


def log_ticks(low: float, high: float) -> list[float]:
    """Plain 1-2-5 ticks (..., 20, 50, 100, 200, ...) spanning [low, high] on a log axis; with
    a narrow range also 3 and 7 per decade, so at least three ticks show."""
    if not (low > 0 and high >= low):
        return []
    first, last = math.floor(math.log10(low)), math.ceil(math.log10(high))
    for mantissas in ((1, 2, 5), (1, 2, 3, 5, 7), (1, 1.5, 2, 3, 4, 5, 6, 7, 8, 9)):
        ticks = [
            float(f"{m * 10.0**e:.6g}")
            for e in range(first, last + 1)
            for m in mantissas
            if low <= m * 10.0**e <= high
        ]
        if len(ticks) >= 3:
            return ticks
    return ticks


def time_axis(t: Sequence[float]) -> tuple[FloatArray, str]:
    """Times since the first as the axis values and label: seconds for runs under 5 minutes,
    else minutes (a one-minute demo reads 0-60 s, not 0.0-1.0 min)."""
    since = np.asarray(t, dtype=np.float64) - (t[0] if len(t) else 0.0)
    if since.size and since[-1] >= 300.0:
        return since / 60.0, "minutes since the first stats run"
    return since, "seconds since the first stats run"


def latency_cdf_png(series: Mapping[str, FloatArray], *, title: str, xlabel: str) -> bytes:
    """Empirical CDF per arm on a log time axis, with the P50 and P99 marked."""
    fig, ax = _figure()
    drawn = False
    for arm, values in series.items():
        x = np.sort(values[np.isfinite(values)])
        if x.size == 0:
            continue
        drawn = True
        y = np.arange(1, x.size + 1) / x.size
        colour = arm_colour(arm, list(series))
        ax.step(x * 1e3, y, where="post", color=colour, label=f"{arm} (n={x.size})")
        for q, style in ((0.5, ":"), (0.99, "--")):
            ax.axvline(float(np.quantile(x, q)) * 1e3, color=colour, linestyle=style, lw=0.9)
    if drawn:
        ax.set_xscale("log")
        low, high = ax.get_xlim()
        ax.xaxis.set_major_locator(FixedLocator(log_ticks(low, high)))
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlim(low, high)
        handles, _ = ax.get_legend_handles_labels()
        handles += [
            Line2D([], [], color="#444444", linestyle=":", lw=0.9, label="P50"),
            Line2D([], [], color="#444444", linestyle="--", lw=0.9, label="P99"),
        ]
        ax.legend(handles=handles, loc="lower right", fontsize=8)
    else:
        _empty(ax)
    ax.set_xlabel(f"{xlabel} (ms, log scale)")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.01)
    ax.set_title(title)
    return _png(fig)


def speedup_over_time_png(
    t: Sequence[float],
    estimate: Sequence[float],
    lower: Sequence[float],
    upper: Sequence[float],
    *,
    title: str,
) -> bytes:
    """A speedup's estimate after each stats run, with its confidence band; 1.0 = no change."""
    fig, ax = _figure()
    if len(t):
        x, label = time_axis(t)
        ax.fill_between(x, lower, upper, color=ARM_COLOURS["speculative"], alpha=0.2, lw=0)
        ax.plot(x, estimate, color=ARM_COLOURS["speculative"], marker="o", ms=3, label="estimate")
        ax.axhline(1.0, color="#777777", lw=0.9, linestyle="--")
        ax.set_xlabel(label)
    else:
        _empty(ax, "no stats run had enough samples for this CI yet")
    ax.set_ylabel("speedup (baseline / speculative)")
    ax.set_title(title)
    return _png(fig)


def acceptance_png(positions: Sequence[float], *, overall: float | None, title: str) -> bytes:
    """Acceptance rate per draft position (bars), with the overall rate as a line."""
    fig, ax = _figure()
    if len(positions):
        x = np.arange(len(positions))
        ax.bar(x, positions, color=ARM_COLOURS["speculative"])
        for xi, value in zip(x, positions, strict=True):
            ax.text(xi, value + 0.01, f"{value:.2f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, [str(i) for i in x])
        if overall is not None:
            ax.axhline(overall, color="#333333", lw=0.9, linestyle="--", label="overall rate")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_xlabel("draft position")
    else:
        _empty(ax, "no per-position acceptance was scraped")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("acceptance rate")
    ax.set_title(title)
    return _png(fig)


def speedup_vs_load_png(
    load: Sequence[float],
    estimate: Sequence[float],
    lower: Sequence[float],
    upper: Sequence[float],
    counts: Sequence[int],
    *,
    xlabel: str,
    title: str,
) -> bytes:
    """A median speedup per load band (at its mean load) with its CI; speculation usually
    fades under load."""
    fig, ax = _figure()
    if len(load):
        est = np.asarray(estimate, dtype=np.float64)
        err = np.vstack([est - np.asarray(lower), np.asarray(upper) - est])
        ax.errorbar(load, est, yerr=err, color=ARM_COLOURS["speculative"], marker="o", capsize=3)
        for x, y, n in zip(load, est, counts, strict=True):
            ax.annotate(f"n={n}", (x, y), textcoords="offset points", xytext=(4, 6), fontsize=7)
        ax.axhline(1.0, color="#777777", lw=0.9, linestyle="--")
    else:
        _empty(ax)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("median speedup")
    ax.set_title(title)
    return _png(fig)


def _figure() -> tuple[Figure, Any]:
    fig = Figure(figsize=_SIZE, dpi=_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    return fig, ax


def _empty(ax: Any, message: str = "no data") -> None:
    ax.text(0.5, 0.5, message, ha="center", va="center", transform=ax.transAxes, color="#777")


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()
