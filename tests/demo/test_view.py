"""The demo's live terminal view (`demo.view`), with and without a stats result."""

from __future__ import annotations

from rich.console import Console

from specproxy.demo.view import ClientTally, plain_line, render
from specproxy.report.summary import arm_rows, main_window, speedup_rows


def test_view_renders_without_stats_and_with_them() -> None:
    tally = ClientTally()
    assert "no stats yet" in plain_line(None, tally)
    console = Console(record=True, width=120)
    console.print(render(None, tally))
    assert "waiting for stats" in console.export_text()
    window = {
        "design": "split",
        "samples": {"baseline": 3, "speculative": 3},
        "metrics": {
            m: {
                "n": {"baseline": 3, "speculative": 3},
                "verdict": "faster",
                "summary": {a: {"median": 0.1, "p99": 0.2} for a in ("baseline", "speculative")},
                "speedup": {
                    "median": {"status": "ok", "estimate": 2.0, "lower": 1.5, "upper": 2.5},
                    "p99": {"status": "insufficient", "n_needed": {"baseline": 7}},
                },
            }
            for m in ("e2e", "ttft", "tpot")
        },
        "engine": {"speculative": {"acceptance_rate": 0.61}},
        "diagnosis": {"summary": "speculation helps", "reasons": [{"message": "why"}]},
    }
    result = {"results": {"all": {"5m": {**window, "window_s": 300.0}, "all": window}}}
    assert main_window(result) is window
    assert arm_rows(result)[0] == (
        "speculative", "3", "100.0 ms", "200.0 ms", "100.0 ms", "100.0 ms", "61.0%"
    )  # fmt: skip
    assert speedup_rows(result)[:2] == [
        ("E2E", "median", "2.000x", "[1.500, 2.500]"),
        ("E2E", "p99", "-", "needs 7 more per arm"),
    ]
    console = Console(record=True, width=140)
    console.print(render(result, tally))
    text = console.export_text()
    assert "2.000x" in text and "faster" in text and "speculation helps" in text
    assert "2.000x" in plain_line(result, tally)
