"""The optional admin token: where it comes from (never a flag) and what it guards."""

from __future__ import annotations

import argparse
import base64
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from specproxy.admin import (
    ADMIN_TOKEN_ENV,
    ADMIN_TOKEN_FILE_ENV,
    authorized,
    load_admin_token,
)
from specproxy.app import create_app
from specproxy.config import Config
from specproxy.errors import ConfigError
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.serve import configure
from tests.test_app import config

TOKEN = "0123456789abcdef0123"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def test_token_from_the_environment_or_a_file(tmp_path: Path) -> None:
    assert load_admin_token({}) is None
    assert load_admin_token({ADMIN_TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")  # as `kubectl create secret` or an editor leaves it
    assert load_admin_token({ADMIN_TOKEN_FILE_ENV: str(secret)}) == TOKEN
    bad = [
        {ADMIN_TOKEN_ENV: "short"},
        {ADMIN_TOKEN_ENV: TOKEN, ADMIN_TOKEN_FILE_ENV: str(secret)},
        {ADMIN_TOKEN_FILE_ENV: str(tmp_path / "missing")},
        {ADMIN_TOKEN_ENV: TOKEN + "\x00x"},
    ]
    for environ in bad:
        with pytest.raises(ConfigError) as info:
            load_admin_token(environ)
        assert TOKEN not in str(info.value)  # the secret never reaches a message or a log


def test_never_a_flag() -> None:
    parser = argparse.ArgumentParser()
    configure(parser)
    flags = {opt for action in parser._actions for opt in action.option_strings}
    assert not [f for f in flags if "token" in f or "admin" in f]


def test_authorization_forms() -> None:
    assert authorized(f"Bearer {TOKEN}", TOKEN) and authorized(f"bearer  {TOKEN} ", TOKEN)
    assert authorized(basic("anyone", TOKEN)["Authorization"], TOKEN)
    for value in (None, "", "Bearer", f"Bearer {TOKEN}x", f"Token {TOKEN}", "Basic !!!",
                  basic(TOKEN, "x")["Authorization"]):  # fmt: skip
        assert not authorized(value, TOKEN)


async def _status(client: object, method: str, path: str, headers: dict[str, str]) -> int:
    async with client.request(method, path, headers=headers) as resp:  # type: ignore[attr-defined]
        if resp.status == 401:
            assert resp.headers.getall("WWW-Authenticate")[0].startswith("Bearer")
            assert (await resp.json())["error"]["type"] == "AuthenticationError"
        return int(resp.status)


@pytest.mark.parametrize("protect_metrics", [False, True])
async def test_what_the_token_guards(aiohttp_client: AiohttpClient, protect_metrics: bool) -> None:
    base = config()
    cfg = Config(
        baseline_url=base.baseline_url,
        speculative_url=base.speculative_url,
        store=base.store,
        protect_metrics=protect_metrics,
    )
    app = create_app(
        cfg,
        registry=CollectorRegistry(),
        recorder=MemoryRecorder(),
        admin_token=TOKEN,
        with_store=False,
        with_stats=False,
    )
    client = await aiohttp_client(app)
    guarded = [("GET", "/api/stats"), ("GET", "/ui"), ("GET", "/ui/app.js"),
               ("POST", "/api/stats"), ("DELETE", "/metrics"), ("POST", "/ui")]  # fmt: skip
    if protect_metrics:
        guarded.append(("GET", "/metrics"))
    for method, path in guarded:
        assert await _status(client, method, path, {}) == 401, (method, path)
        assert await _status(client, method, path, {"Authorization": "Bearer wrong"}) == 401
        assert await _status(client, method, path, BEARER) != 401
    assert await _status(client, "GET", "/ui", basic("me", TOKEN)) == 200  # a browser's way
    assert await _status(client, "GET", "/api/stats", BEARER) in (200, 503)
    # Open: probes, /metrics unless protected, and the product itself (its own Authorization).
    assert await _status(client, "GET", "/healthz", {}) == 200
    assert await _status(client, "GET", "/readyz", {}) == 503  # both arms closed: not ready
    if not protect_metrics:
        assert await _status(client, "GET", "/metrics", {}) == 200
    assert await _status(client, "GET", "/v1/models", {}) == 502  # forwarded (arm closed)


async def test_without_a_token_nothing_is_guarded(aiohttp_client: AiohttpClient) -> None:
    app = create_app(
        config(),
        registry=CollectorRegistry(),
        recorder=MemoryRecorder(),
        with_store=False,
        with_stats=False,
    )
    client = await aiohttp_client(app)
    for path in ("/api/stats", "/ui", "/metrics"):
        assert await _status(client, "GET", path, {}) != 401
