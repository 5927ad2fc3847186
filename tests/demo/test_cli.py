"""`specproxy demo` (`demo.cli`): flag checks, the defaults for real vLLM, and whole runs.

The subprocess run is `make demo` without a terminal, stopped with Ctrl-C (SIGINT) part-way.
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

from specproxy.demo import cli
from specproxy.demo.runner import DemoOptions
from specproxy.errors import ConfigError
from specproxy.report.summary import main_window


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cli.configure(parser)
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
        (("--max-tokens", "-1"), "--max-tokens"),
        (("--vllm", "http://a,http://b", "--overload"), "--overload"),
        (("--vllm-python", "/py", "--arms", "3"), "--arms 3"),
    ],
)
def test_bad_options(argv: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        cli.options_from_args(_args(*argv))


def test_vllm_urls_are_split_and_real_servers_get_gentler_defaults() -> None:
    opts = cli.options_from_args(_args("--vllm", "http://s:1, http://b:2"))
    assert opts.vllm_urls == ("http://s:1", "http://b:2")
    assert (opts.rate, opts.max_tokens) == (cli.REAL_RATE, cli.REAL_MAX_TOKENS)
    opts = cli.options_from_args(_args("--vllm-python", "/py", "--rate", "3", "--max-tokens", "9"))
    assert (opts.vllm_python, opts.rate, opts.max_tokens) == ("/py", 3.0, 9)
    emulated = cli.options_from_args(_args())
    assert (emulated.rate, emulated.max_tokens) == (DemoOptions().rate, 64)
    assert not emulated.overload
    own = cli.options_from_args(_args("--max-tokens", "0", "--overload"))
    assert own.max_tokens is None and own.overload  # 0: the prompts' own budgets
    assert emulated.arms == 2  # `make demo` stays the two-arm demo
    assert cli.options_from_args(_args("--arms", "3")).arms == 3


@pytest.mark.slow
def test_memory_store_still_gets_a_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--store memory://` keeps the run only while the proxy lives: the report is written first."""
    out = tmp_path / "mem"
    argv = (
        "--store", "memory://", "--duration", "4", "--rate", "20", "--max-tokens", "16",
        "--port", "0", "--out", str(out), "--stats-interval", "1", "--resamples", "100",
    )  # fmt: skip
    assert cli.run(_args(*argv)) == 0
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


@pytest.mark.slow
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


def test_next_steps_name_the_store_and_paste_ready_commands(tmp_path: Path) -> None:
    import shlex

    from specproxy.cli import build_parser
    from specproxy.demo.cli import next_steps

    store = f"sqlite:///{tmp_path}/demo store.db"
    lines = next_steps(store, "run 1")
    assert str((tmp_path / "demo store.db").resolve()) in lines[0]
    commands = [line.strip() for line in lines if line.strip().startswith("specproxy ")]
    assert [c.split()[1] for c in commands] == ["stats", "report"]
    for command in commands:
        argv = shlex.split(command)[1:]
        args = build_parser(argv[0]).parse_args(argv)
        assert args.store == store and args.run_id == "run 1"


def test_next_steps_for_a_memory_store_say_it_is_gone() -> None:
    from specproxy.demo.cli import next_steps

    assert "gone" in next_steps("memory://", "r")[0]
