"""The demo's terminal view: rich tables when there is a terminal, one plain line when not.

It fits an 80x24 terminal (tests/demo/test_view.py renders it in a real pseudo-terminal of that
size): per-arm latency, one speedup row per metric with its verdict and the median and P99 CIs,
the diagnosis with its first reasons. Rendering is pure (a stats result and the client's tally
in, a renderable or a string out), so it can be tested without a terminal. Per-arm latency
comes from the client's own results while the stats job has not run yet, then from the stats
result, which is what /api/stats and the report show. With several treatments (`--arms 3`) the
speedup table has a row per treatment and metric, and a `best` line says which one leads; the
diagnosis shown is the first treatment's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from specproxy.loadgen import ClientResult
from specproxy.records import SHORTHAND_ARMS
from specproxy.stats.result import StatsResult

__all__ = ["MAX_REASONS", "ClientTally", "plain_line", "render"]

# The view fits an 80x24 terminal: two compact tables, the diagnosis and its first reasons,
# each reason whole (wrapped), as many as fit in MAX_REASONS rows of VIEW_WIDTH columns.
MAX_REASONS = 3
VIEW_WIDTH = 80


@dataclass(slots=True)
class ClientTally:
    """Latencies the load generator saw, per arm (from the proxy's `x-specproxy-arm` header)."""

    e2e: dict[str, list[float]] = field(default_factory=dict)
    ttft: dict[str, list[float]] = field(default_factory=dict)
    tpot: dict[str, list[float]] = field(default_factory=dict)
    errors: int = 0
    sent: int = 0

    def add(self, result: ClientResult) -> None:
        self.sent += 1
        if not result.ok:
            self.errors += 1
            return
        arm = result.arm if result.arm is not None else "unknown"
        self.e2e.setdefault(arm, []).append(result.e2e_ns / 1e9)
        if result.ttft_ns is not None:
            self.ttft.setdefault(arm, []).append(result.ttft_ns / 1e9)
        if result.measures.tpot_s is not None:
            self.tpot.setdefault(arm, []).append(result.measures.tpot_s)

    def quantile(self, column: str, arm: str, q: float) -> float | None:
        values = getattr(self, column).get(arm)
        return float(np.quantile(values, q)) if values else None


def render(stats: StatsResult | None, tally: ClientTally, *, title: str = "live") -> RenderableType:
    """The whole view: per-arm latency, then speedups, acceptance, verdicts and diagnosis."""
    from specproxy.report.summary import (
        arm_rows,
        best_line,
        diagnosis_lines,
        main_window,
        treatments_of,
    )

    parts: list[RenderableType] = []
    arms = Table(
        title=f"specproxy demo ({title}): per arm",
        expand=False,
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
    )
    for column in ("arm", "n", "E2E p50", "E2E p99", "TTFT p50", "TPOT p50", "accept"):
        arms.add_column(column, justify="right", no_wrap=True)
    rows = arm_rows(stats) if stats is not None else []
    if rows:
        for row in rows:
            arms.add_row(*row)
    else:
        # the shorthand's two arms from the start; named arms (A/B/n) as their answers come
        named = not set(tally.e2e) <= set(SHORTHAND_ARMS)
        for arm in sorted(tally.e2e) if named else SHORTHAND_ARMS:
            arms.add_row(
                arm,
                str(len(tally.e2e.get(arm, []))),
                _ms(tally.quantile("e2e", arm, 0.5)),
                _ms(tally.quantile("e2e", arm, 0.99)),
                _ms(tally.quantile("ttft", arm, 0.5)),
                _ms(tally.quantile("tpot", arm, 0.5)),
                "-",
            )
        arms.caption = "client-side figures until the first stats run"
    parts.append(arms)
    if stats is None:
        parts.append(
            Text(f"requests sent: {tally.sent}, errors: {tally.errors}; waiting for stats")
        )
        return Group(*parts)
    treatments = treatments_of(stats)
    many = len(treatments) > 1
    parts.append(_speedups_table(stats, treatments) if many else _speedup_table(stats))
    best = best_line(window) if (window := main_window(stats)) is not None else None
    if best is not None:
        parts.append(Text(best))
    # several treatments: their rows and the best line take the reasons' rows (the report has
    # them)
    reason_rows = 0 if many else MAX_REASONS
    diagnosis = diagnosis_lines(stats)
    if diagnosis:
        head = diagnosis[0].replace("diagnosis:", f"diagnosis ({treatments[0]}):", 1)
        head = head if many else diagnosis[0]
        parts.append(Text(head))  # the headline wraps, never cut
    shown, used = 0, 0
    for line in diagnosis[1 : 1 + reason_rows]:
        need = -(-len(line) // VIEW_WIDTH)  # wrapped, never cut: a reason's end is its point
        if shown and used + need > reason_rows:
            break
        parts.append(Text(line))
        shown, used = shown + 1, used + need
    if len(diagnosis) > 1 + shown:
        parts.append(Text(f"  (+{len(diagnosis) - 1 - shown} more in the report)"))
    parts.append(Text(f"requests sent: {tally.sent}, client errors: {tally.errors}"))
    return Group(*parts)


def _speedup_table(stats: StatsResult) -> Table:
    """metric | verdict | median | p99: speedup with its CI, one row per metric (fits 80 cols)."""
    from specproxy.report.summary import speedup_rows, verdict_rows

    table = Table(
        title="speedup = baseline / speculative (> 1: faster), 95% CI",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
    )
    statistics = ("median", "p99")
    for column in ("metric", "verdict", *statistics):
        table.add_column(column, justify="right", no_wrap=True)
    cells: dict[str, dict[str, str]] = {}
    for label, stat, estimate, ci in speedup_rows(stats, statistics):
        cells.setdefault(label, {})[stat] = ci if estimate == "-" else f"{estimate} {ci}"
    for label, verdict in verdict_rows(stats):
        row = cells.get(label, {})
        table.add_row(label, verdict, *(row.get(s, "-") for s in statistics))
    return table


def _speedups_table(stats: StatsResult, treatments: list[str]) -> Table:
    """`_speedup_table` with a row per treatment and metric, the treatment named in its first
    row's metric cell (a column of its own would not fit 80 columns)."""
    from specproxy.report.summary import speedup_rows, verdict_rows

    table = Table(
        title="speedup = control / treatment (> 1: faster), 95% CI",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
    )
    statistics = ("median", "p99")
    for column in ("metric", "verdict", *statistics):
        table.add_column(column, justify="right", no_wrap=True)
    for treatment in treatments:
        cells: dict[str, dict[str, str]] = {}
        for label, stat, estimate, ci in speedup_rows(stats, statistics, treatment):
            cells.setdefault(label, {})[stat] = ci if estimate == "-" else f"{estimate} {ci}"
        for i, (label, verdict) in enumerate(verdict_rows(stats, treatment)):
            row = cells.get(label, {})
            metric = f"{treatment} {label}" if i == 0 else label
            table.add_row(metric, verdict, *(row.get(s, "-") for s in statistics))
    return table


def plain_line(stats: StatsResult | None, tally: ClientTally) -> str:
    """One status line for logs and CI (no terminal)."""
    head = f"sent {tally.sent}, errors {tally.errors}"
    if stats is None:
        spec, base = (tally.quantile("e2e", a, 0.5) for a in SHORTHAND_ARMS)
        return f"{head}; client E2E p50 speculative {_ms(spec)}, baseline {_ms(base)}; no stats yet"
    from specproxy.report.summary import (
        best_line,
        main_window,
        speedup_rows,
        treatments_of,
        verdict_rows,
    )

    treatments = treatments_of(stats)
    if len(treatments) > 1:
        each = []
        for t in treatments:
            speed = "; ".join(" ".join(r) for r in speedup_rows(stats, treatment=t)[:2])
            verdict = ", ".join(f"{m}: {v}" for m, v in verdict_rows(stats, t))
            each.append(f"{t}: {speed}; {verdict}")
        best = best_line(window) if (window := main_window(stats)) is not None else None
        return "; ".join([head, *each, *([best] if best is not None else [])])
    speed = "; ".join(" ".join(r) for r in speedup_rows(stats)[:2])
    verdict = ", ".join(f"{m}: {v}" for m, v in verdict_rows(stats))
    return f"{head}; {speed}; {verdict}"


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds is not None else "-"
