"""`specproxy arms` against a running proxy's admin API: the table, each change, errors, who."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from pytest_aiohttp import AiohttpClient

from specproxy.admin import ADMIN_TOKEN_ENV
from specproxy.appkeys import CONTROL, ROUTER
from specproxy.cli import main
from tests.control.test_api import TOKEN, control_app, control_config
from tests.test_app import closed_url


async def _arms(*args: str) -> int:
    return await asyncio.to_thread(main, ["arms", *args])


async def test_the_table_and_every_change(
    aiohttp_client: AiohttpClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    app = control_app(control_config(tmp_path))
    client = await aiohttp_client(app)
    url = str(client.make_url("/"))
    assert await _arms("--url", url) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split() == ["ARM", "ROLE", "CONFIGURED", "WEIGHT", "SHARE", "STATE"]
    assert table[1].split() == ["speculative", "treatment", "0.500", "0.500", "0.500", "active"]
    assert table[2].split() == ["baseline", "control", "0.500", "-", "0.500", "active"]
    assert "running" in table[3]
    assert await _arms("--url", url, "set", "speculative", "--weight", "0.3", "--why", "ramp") == 0
    out = capsys.readouterr().out
    assert "stored event #1" in out and "set speculative 0.3 by admin: ramp" in out
    assert app[ROUTER].share == 0.3
    assert await _arms("pause", "speculative", "--url", url) == 0  # options after the action too
    assert "paused" in capsys.readouterr().out and app[ROUTER].share == 0.0
    assert await _arms("resume", "speculative", "--url", url) == 0
    assert await _arms("stop", "--url", url, "--why", "p99") == 0
    assert "STOPPED" in capsys.readouterr().out and app[CONTROL].state.stopped
    assert await _arms("start", "--url", url, "--json") == 0
    assert '"stopped": false' in capsys.readouterr().out


async def test_errors_are_one_line_and_exit_1(
    aiohttp_client: AiohttpClient, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    client = await aiohttp_client(control_app(control_config(tmp_path)))
    url = str(client.make_url("/"))
    assert await _arms("--url", url, "set", "baseline", "--weight", "0.5") == 1
    assert "404: baseline is the control arm" in capsys.readouterr().err
    assert await _arms("--url", url, "set", "speculative", "--weight", "2") == 1
    assert "400: weight must be" in capsys.readouterr().err
    assert await _arms("--url", closed_url(), "stop") == 1
    assert "cannot reach" in capsys.readouterr().err


async def test_the_token_comes_from_the_environment_and_who_names_the_caller(
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = control_app(control_config(tmp_path), token=TOKEN)
    client = await aiohttp_client(app)
    url = str(client.make_url("/"))
    assert await _arms("--url", url, "stop") == 1
    assert "401" in capsys.readouterr().err
    monkeypatch.setenv(ADMIN_TOKEN_ENV, TOKEN)
    assert await _arms("--url", url, "--who", "alice", "stop", "--why", "on call") == 0
    assert "stop * by alice: on call" in capsys.readouterr().out
    assert await _arms("--url", url, "start") == 0
    assert "start * by admin" in capsys.readouterr().out
