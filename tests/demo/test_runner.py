"""`demo.runner.run_demo` end to end: emulated arms, proxy, store, stats, load, report.

The report's numbers must be the final GET /api/stats result.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

from specproxy.demo.runner import DemoOptions, run_demo
from specproxy.report.summary import fmt_ratio, main_window

pytestmark = pytest.mark.slow


async def test_short_demo_report_matches_api_stats(tmp_path: Path) -> None:
    opts = DemoOptions(
        rate=12.0,
        duration_s=12.0,
        port=0,
        store=f"sqlite:///{tmp_path / 'demo.db'}",
        out=str(tmp_path / "report"),
        max_tokens=48,
        stats_interval_s=1.0,
        scrape_interval_s=1.0,
        resamples=300,
        time_scale=0.5,
    )
    outcome = await run_demo(opts, console=Console(quiet=True))
    assert not outcome.interrupted
    assert outcome.final_stats is not None and outcome.report_dir is not None
    ok = [r for r in outcome.results if r.ok]
    assert len(ok) > 80 and {r.arm for r in ok} == {"speculative", "baseline"}

    report = json.loads((outcome.report_dir / "report.json").read_text())
    # The report states exactly the final result that GET /api/stats served.
    assert report["stats"] == outcome.final_stats
    final = main_window(outcome.final_stats)
    assert final is not None
    # Every request the client saw is in the store, and the stats job saw all of them.
    assert sum(final["samples"].values()) + sum(final["excluded_warmup"].values()) == len(ok)
    for metric in ("e2e", "tpot"):
        for arm in ("speculative", "baseline"):
            shown = report["figure_data"]["latency"][metric][arm]
            assert shown["n"] == final["metrics"][metric]["n"][arm]
            summary = final["metrics"][metric]["summary"][arm]
            # the figure's median is the rows' own, the result's is read off the grid: they
            # agree within the bound the window states
            bound = final["grid_error_bound"]
            assert shown["median"] == pytest.approx(summary["median"], rel=bound)
    html = (outcome.report_dir / "index.html").read_text()
    speedup = final["metrics"]["tpot"]["speedup"]["median"]
    estimate = speedup["estimate"]
    # The speedup is wall-clock and so depends on the machine's load; what the code guarantees is
    # that it is the ratio of the two arms' medians it reports beside it.
    tpot = final["metrics"]["tpot"]["summary"]
    assert speedup["status"] == "ok" and estimate is not None
    base, spec = tpot["baseline"]["median"], tpot["speculative"]["median"]
    assert base is not None and spec is not None
    assert estimate == pytest.approx(base / spec)
    assert fmt_ratio(speedup["estimate"]) in html
    assert f">{final['metrics']['e2e']['verdict']}<" in html
