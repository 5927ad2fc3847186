"""The demo's live terminal view (`demo.view`), with and without a stats result."""

from __future__ import annotations

from typing import Any, cast

from rich.console import Console

from specproxy.demo.view import ClientTally, plain_line, render
from specproxy.report.summary import arm_rows, main_window, speedup_rows
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


_PTY_SCRIPT = """
import json, sys
from rich.console import Console
from specproxy.demo.view import ClientTally, render
console = Console()
print(f"SIZE {console.size.width}x{console.size.height}")
console.print(render(json.loads(sys.argv[1]), ClientTally(sent=24690)))
print("END")
"""


def test_view_fits_an_80x24_pseudo_terminal() -> None:
    """Rendered by rich in a real pseudo-terminal of 80x24: <= 24 rows, numbers never cut."""
    import fcntl
    import json
    import os
    import pty
    import struct
    import subprocess
    import sys
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    proc = subprocess.Popen(
        [sys.executable, "-c", _PTY_SCRIPT, json.dumps(_full_result())],
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
    assert body.count("2.163x [1.891, 2.421]") == 6  # three metrics x (median, p99), uncut
    assert "12345" in body and "inconclusive" in body
    assert " speculative " in body and "1234.5 ms" in body and "61.0%" in body
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
