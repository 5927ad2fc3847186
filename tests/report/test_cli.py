"""`specproxy report` (`report.cli`): flags to `build.write_report`, and what it prints."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from specproxy.cli import main
from tests.report.test_build import RUN, WARMUP, _fill


def test_writes_the_report_with_the_flags_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    asyncio.run(_fill(url, history=False))  # no history: the report computes with the flags
    out = tmp_path / "out"
    argv = ["report", "--store", url, "--out", str(out), "--run-id", RUN]
    argv += ["--warmup-requests", str(WARMUP), "--resamples", "200"]
    assert main(argv) == 0
    assert capsys.readouterr().out.strip() == f"report: {out / 'index.html'}"
    settings = json.loads((out / "report.json").read_text())["stats"]["settings"]
    assert (settings["resamples"], settings["warmup_requests"]) == (200, WARMUP)


def test_an_empty_store_is_exit_code_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    assert main(["report", "--store", url, "--out", str(tmp_path / "x"), "--run-id", "r"]) == 1
    assert capsys.readouterr().out.strip() == f"no records in {url} for run r"
