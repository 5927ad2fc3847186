"""The report's figures, drawn with matplotlib from plain arrays into PNG bytes.

Figures are built on `matplotlib.figure.Figure` with the Agg canvas directly, never through
pyplot: no global figure state, no GUI backend, safe in a worker thread. Each arm keeps the same
colour in every figure (speculative blue, baseline orange).
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

__all__ = [
    "ARM_COLOURS",
    "acceptance_png",
    "latency_cdf_png",
    "speedup_over_time_png",
    "speedup_vs_load_png",
]

ARM_COLOURS = {"speculative": "#1f6fb4", "baseline": "#e07b1a"}
_DPI = 110
_SIZE = (6.4, 3.6)

FloatArray = npt.NDArray[np.float64]


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
        colour = ARM_COLOURS.get(arm, "#444444")
        ax.step(x * 1e3, y, where="post", color=colour, label=f"{arm} (n={x.size})")
        for q, style in ((0.5, ":"), (0.99, "--")):
            ax.axvline(float(np.quantile(x, q)) * 1e3, color=colour, linestyle=style, lw=0.9)
    if drawn:
        ax.set_xscale("log")
        ax.legend(loc="lower right", fontsize=8)
    else:
        _empty(ax)
    ax.set_xlabel(f"{xlabel} (ms, log scale; dotted P50, dashed P99)")
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
        t0 = t[0]
        minutes = (np.asarray(t, dtype=np.float64) - t0) / 60.0
        ax.fill_between(minutes, lower, upper, color=ARM_COLOURS["speculative"], alpha=0.2, lw=0)
        ax.plot(minutes, estimate, color=ARM_COLOURS["speculative"], marker="o", ms=3)
        ax.axhline(1.0, color="#777777", lw=0.9, linestyle="--")
        ax.set_xlabel("minutes since the first stats run")
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
    """Median-E2E speedup per load bin with its CI; speculation usually fades under load."""
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
    ax.set_ylabel("median E2E speedup")
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
