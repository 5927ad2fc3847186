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
    asyncio.run(_empty_store(url))
    assert main(["report", "--store", url, "--out", str(tmp_path / "x"), "--run-id", "r"]) == 1
    assert capsys.readouterr().out.strip() == f"no records in {url} for run r"


def test_a_missing_store_is_exit_code_2_and_not_created(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'missing.db'}"
    assert main(["report", "--store", url, "--out", str(tmp_path / "x")]) == 2
    assert capsys.readouterr().err.strip() == f"specproxy: error: no store at {url}"
    assert not (tmp_path / "missing.db").exists() and not (tmp_path / "x").exists()


async def _empty_store(url: str) -> None:
    from specproxy.config import StoreConfig
    from specproxy.store.factory import open_store

    store = open_store(StoreConfig(url=url))
    await store.start()
    await store.close()
