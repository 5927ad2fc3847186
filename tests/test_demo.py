"""`specproxy demo` end to end: emulated arms, proxy, store, stats, load, report.

The in-process run checks that the report's numbers are the final GET /api/stats result; the
subprocess run is `make demo` without a terminal, stopped with Ctrl-C (SIGINT) part-way.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from specproxy import demo
from specproxy.demo.view import ClientTally, plain_line, render
from specproxy.errors import ConfigError
from specproxy.records import Arm
from specproxy.report.summary import arm_rows, fmt_ratio, main_window, speedup_rows

pytestmark = pytest.mark.slow


async def test_short_demo_report_matches_api_stats(tmp_path: Path) -> None:
    opts = demo.DemoOptions(
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
    outcome = await demo.run_demo(opts, console=Console(quiet=True))
    assert not outcome.interrupted
    assert outcome.final_stats is not None and outcome.report_dir is not None
    ok = [r for r in outcome.results if r.ok]
    assert len(ok) > 80 and {r.arm for r in ok} == set(Arm)

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
            assert shown["median"] == pytest.approx(summary["median"])
    html = (outcome.report_dir / "index.html").read_text()
    speedup = final["metrics"]["tpot"]["speedup"]["median"]
    assert speedup["status"] == "ok" and speedup["estimate"] > 1.2  # k=4, alpha 0.8: faster
    assert fmt_ratio(speedup["estimate"]) in html
    assert f">{final['metrics']['e2e']['verdict']}<" in html


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


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    demo.configure(parser)
    return parser.parse_args(list(argv))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--vllm", "http://a"), "two URLs"),
        (("--vllm", "http://a,http://b", "--vllm-python", "/x"), "exclude each other"),
        (("--rate", "0"), "--rate"),
        (("--duration", "-1"), "--duration"),
        (("--acceptance", "1.5"), "--acceptance"),
        (("--speculative-tokens", "0"), "--speculative-tokens"),
    ],
)
def test_bad_options(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        demo.options_from_args(_args(*argv))


def test_vllm_urls_are_split_and_real_servers_get_gentler_defaults() -> None:
    opts = demo.options_from_args(_args("--vllm", "http://s:1, http://b:2"))
    assert opts.vllm_urls == ("http://s:1", "http://b:2")
    assert (opts.rate, opts.max_tokens) == (demo.REAL_RATE, demo.REAL_MAX_TOKENS)
    opts = demo.options_from_args(_args("--vllm-python", "/py", "--rate", "3", "--max-tokens", "9"))
    assert (opts.vllm_python, opts.rate, opts.max_tokens) == ("/py", 3.0, 9)
    emulated = demo.options_from_args(_args())
    assert (emulated.rate, emulated.max_tokens) == (demo.DemoOptions().rate, None)


def test_memory_store_still_gets_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--store memory://` keeps the run only while the proxy lives: the report is written first."""
    out = tmp_path / "mem"
    argv = (
        "--store", "memory://", "--duration", "4", "--rate", "20", "--max-tokens", "16",
        "--port", "0", "--out", str(out), "--stats-interval", "1", "--resamples", "100",
    )  # fmt: skip
    assert demo.run(_args(*argv)) == 0
    printed = capsys.readouterr().out.replace("\n", "")  # rich wraps the long path
    assert f"report: {out / 'index.html'}" in printed and "no report" not in printed
    report = json.loads((out / "report.json").read_text())
    final = main_window(report["stats"])
    assert final is not None and not report["stats"]["run_id"].startswith("default")
    recorded = sum(final["samples"].values()) + sum(final["excluded_warmup"].values())
    assert recorded > 40  # ~80 requests were sent; every one went through the store
    for arm in ("speculative", "baseline"):
        assert (
            report["figure_data"]["latency"]["e2e"][arm]["n"] == final["metrics"]["e2e"]["n"][arm]
        )


def test_cli_without_terminal_stops_on_ctrl_c(tmp_path: Path) -> None:
    """`specproxy demo` with plain stdout; SIGINT part-way still leaves a report."""
    cmd = [
        sys.executable, "-m", "specproxy", "demo", "--duration", "120", "--rate", "10",
        "--port", "0", "--store", f"sqlite:///{tmp_path / 'cli.db'}", "--out",
        str(tmp_path / "out"), "--stats-interval", "1", "--resamples", "200", "--max-tokens", "32",
    ]  # fmt: skip
    env = {**os.environ, "COLUMNS": "120"}
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("stats JSON:"):
                break
        time.sleep(8)
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines) + rest
    assert proc.returncode == 0, output
    for url in ("/ui", "/metrics", "/api/stats"):
        assert url in output
    assert f"report: {tmp_path / 'out' / 'index.html'}" in output
    assert "\x1b[" not in output  # no terminal: no escape codes
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["stats"] is not None
