"""The demo's live terminal view (`demo.view`), with and without a stats result."""

from __future__ import annotations

from typing import Any, cast

import pytest
from rich.console import Console

from specproxy.demo.view import ClientTally, plain_line, render
from specproxy.report.summary import (
    arm_rows,
    best_line,
    main_window,
    speedup_rows,
    treatments_of,
)
from specproxy.stats.result import StatsResult


def test_view_renders_without_stats_and_with_them() -> None:
    tally = ClientTally()
    assert "no stats yet" in plain_line(None, tally)
    console = Console(record=True, width=120)
    console.print(render(None, tally))
    assert "waiting for stats" in console.export_text()
    window: dict[str, Any] = {  # a partial result: only what the view reads
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
    result = cast(
        StatsResult, {"results": {"all": {"5m": {**window, "window_s": 300.0}, "all": window}}}
    )
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


def _full_result() -> dict[str, object]:
    """A stats result with every statistic and many diagnosis reasons (the tallest view)."""
    ok = {"status": "ok", "estimate": 2.1634, "lower": 1.8912, "upper": 2.4211}
    window = {
        "design": "split",
        "samples": {"baseline": 12345, "speculative": 12345},
        "metrics": {
            m: {
                "n": {"baseline": 12345, "speculative": 12345},
                "verdict": "inconclusive",
                "summary": {
                    a: {"median": 0.1234, "p99": 1.2345} for a in ("baseline", "speculative")
                },
                "speedup": {s: ok for s in ("median", "mean", "p90", "p99")},
            }
            for m in ("e2e", "ttft", "tpot")
        },
        "engine": {"speculative": {"acceptance_rate": 0.61}},
        "diagnosis": {
            "summary": "E2E median 2.16x [1.89, 2.42] but the anytime-valid test is not yet sure",
            "reasons": [{"message": f"reason {i}: " + "words " * 20} for i in range(6)],
        },
    }
    return {"results": {"all": {"all": window}}}


def _three_arm_result() -> dict[str, object]:
    """`_full_result` as A/B/n (schema 3) over baseline, ngram-k2 and ngram-k4."""
    treatments = ("ngram-k2", "ngram-k4")
    base: Any = _full_result()["results"]
    one = base["all"]["all"]
    comparisons = {}
    for t in treatments:
        arms = ("baseline", t)
        comparisons[t] = {
            **one,
            "treatment": t,
            "samples": {a: 12345 for a in arms},
            "metrics": {
                m: {
                    **block,
                    "n": {a: 12345 for a in arms},
                    "summary": {a: {"median": 0.1234, "p99": 1.2345} for a in arms},
                }
                for m, block in one["metrics"].items()
            },
            "engine": {t: {"acceptance_rate": 0.61}},
        }
    window = {
        **comparisons["ngram-k2"],
        "control": "baseline",
        "treatments": list(treatments),
        "comparisons": comparisons,
        "best": {
            "metric": "e2e",
            "statistic": "median",
            "state": "winner",
            "leader": "ngram-k2",
            "runner_up": "ngram-k4",
            "speedups": {"ngram-k2": 1.7512, "ngram-k4": 1.3021},
            "margin": None,
            "separated_from": ["ngram-k4"],
            "level": 0.025,
            "reason": "ngram-k2 is faster than every other treatment",
        },
    }
    return {"results": {"all": {"all": window}}}


def test_three_arms_show_each_treatments_comparison_and_the_best_answer() -> None:
    result = cast(StatsResult, _three_arm_result())
    assert treatments_of(result) == ["ngram-k2", "ngram-k4"]
    assert [row[0] for row in arm_rows(result)] == ["ngram-k2", "ngram-k4", "baseline"]
    assert speedup_rows(result, treatment="ngram-k4")[0] == (
        "E2E", "median", "2.163x", "[1.891, 2.421]"
    )  # fmt: skip
    window = main_window(result)
    assert window is not None
    best = best_line(window)
    assert best is not None and best.startswith("best: ngram-k2, 1.751x over baseline; "), best
    assert best.endswith(" over the runner-up ngram-k4"), best
    line = plain_line(result, ClientTally())
    assert "ngram-k2: E2E median" in line and "ngram-k4: E2E median" in line and "best" in line
    # a two-arm result has no best line (its one comparison is the answer)
    two_arms = main_window(cast(StatsResult, _full_result()))
    assert two_arms is not None and best_line(two_arms) is None


_PTY_SCRIPT = """
import json, sys
from rich.console import Console
from specproxy.demo.view import ClientTally, render
console = Console()
print(f"SIZE {console.size.width}x{console.size.height}")
console.print(render(json.loads(sys.argv[1]), ClientTally(sent=24690)))
print("END")
"""


@pytest.mark.parametrize("arms", [2, 3])
def test_view_fits_an_80x24_pseudo_terminal(arms: int) -> None:
    """Rendered by rich in a real pseudo-terminal of 80x24: <= 24 rows, numbers never cut."""
    import fcntl
    import json
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    result = _three_arm_result() if arms == 3 else _full_result()
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _PTY_SCRIPT, json.dumps(result)],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env={**env, "TERM": "xterm-256color"},
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    proc.wait(timeout=60)
    os.close(master)
    import re

    text = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", b"".join(chunks).decode())
    lines = text.replace("\r\n", "\n").split("\n")
    assert "SIZE 80x24" in lines[0]
    view = lines[1 : lines.index("END")]
    assert len(view) <= 24, "\n".join(view)
    assert all(len(line) <= 80 for line in view)
    body = "\n".join(view)
    # three metrics x (median, p99) per treatment, uncut
    assert body.count("2.163x [1.891, 2.421]") == 6 * (arms - 1)
    assert "12345" in body and "inconclusive" in body
    assert "1234.5 ms" in body and "61.0%" in body
    if arms == 2:
        assert " speculative " in body
    else:
        assert " ngram-k2 " in body and " ngram-k4 " in body and " baseline " in body
        assert "best: ngram-k2, " in body
    assert "not yet sure" in " ".join(body.split())  # the headline wraps, never cut


def test_diagnosis_reasons_wrap_and_are_never_cut() -> None:
    """Issue 28 item 5: the view cut diagnosis reasons at 80 columns."""
    from rich.console import Console

    from specproxy.demo.view import ClientTally, render

    result: Any = _full_result()
    window = result["results"]["all"]["all"]
    reason = "a reason long enough to need two lines at eighty columns, " * 2 + "and its point"
    window["diagnosis"]["reasons"] = [{"message": reason}]
    console = Console(record=True, width=80)
    console.print(render(cast(StatsResult, result), ClientTally(sent=1)))
    text = " ".join(console.export_text().split())
    assert reason in text
