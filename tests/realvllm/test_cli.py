"""`specproxy vllm` (`realvllm.cli`) with fake servers: it prints the URLs, notices a crash."""

from __future__ import annotations

import argparse
import re
import sys
from functools import partial
from pathlib import Path

import pytest

from specproxy.realvllm import cli
from specproxy.realvllm.launcher import VllmPair
from tests.realvllm.test_launcher import FAKE, REPO


def test_cli_prints_the_urls_and_reports_a_dead_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    env = {"PYTHONPATH": str(REPO), "FAKE_VLLM_LIFETIME": "2"}
    monkeypatch.setattr(cli, "VllmPair", partial(VllmPair, module=FAKE, extra_env=env))
    parser = argparse.ArgumentParser()
    cli.configure(parser)
    args = parser.parse_args(
        ["--vllm-python", sys.executable, "--log-dir", str(tmp_path), "--cache-dir", str(tmp_path)]
    )
    assert cli.run(args) == 1  # the fake servers exit after 2 s, as if they crashed
    out = capsys.readouterr()
    assert re.search(r"speculative: http://127\.0\.0\.1:\d+", out.out)
    assert "specproxy serve --speculative http://127.0.0.1:" in out.out
    assert "exited unexpectedly" in out.err
