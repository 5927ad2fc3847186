"""Which headers cross the proxy, and which paths it refuses to proxy."""

from __future__ import annotations

import asyncio
import logging
from typing import Literal

import pytest
from multidict import CIMultiDict

from specproxy.config import ArmConfig
from specproxy.proxy.headers import ArmHeaders, OutboundHeaders
from tests.proxy.conftest import CHAT, SPEC_ONLY, Arms, MakeProxy, chat


@pytest.mark.parametrize("stream", [False, True])  # the lean client and aiohttp's
async def test_headers_hop_by_hop_stripped_authorization_forwarded_never_logged(
    arms: Arms, make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await make_proxy(routing=SPEC_ONLY)
    headers = {
        "Authorization": "Bearer sk-secret-123",
        "Connection": "keep-alive, X-Drop-Me",
        "X-Drop-Me": "1",
        "Keep-Alive": "timeout=5",
        "X-Keep-Me": "2",
        "User-Agent": "my-client/1.0",
    }
    async with proxy.client.post(CHAT, json=chat(stream=stream), headers=headers) as resp:
        await resp.read()
    seen = {k.lower(): v for k, v in arms.speculative.seen[-1]["headers"].items()}
    assert seen["authorization"] == "Bearer sk-secret-123"
    assert seen["x-keep-me"] == "2"
    assert "x-drop-me" not in seen and "keep-alive" not in seen
    assert seen["user-agent"] == "my-client/1.0"  # the client's, not the proxy's library's
    assert "sk-secret-123" not in caplog.text


@pytest.mark.parametrize("stream", [False, True])
async def test_the_proxy_overrides_its_own_headers_sent_by_the_upstream(
    make_proxy: MakeProxy, stream: bool
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    headers = {"x-fake-own-headers": "1"}
    async with proxy.client.post(CHAT, json=chat(stream=stream), headers=headers) as resp:
        await resp.read()
    assert resp.headers.getall("x-specproxy-arm") == ["speculative"]
    (request_id,) = resp.headers.getall("x-specproxy-request-id")
    assert request_id == proxy.recorder.records[-1].request_id
    assert resp.headers["x-fake-arm"] == "speculative"


@pytest.mark.parametrize(
    "target",
    ["http://evil.example/v1/models", "/v1/../health", "/v1/%2e%2e/health", "/v1//x"],
)
async def test_never_an_open_proxy(arms: Arms, make_proxy: MakeProxy, target: str) -> None:
    proxy = await make_proxy()
    assert proxy.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.server.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    assert status_line.split()[1] in (b"400", b"404")
    assert not arms.baseline.seen and not arms.speculative.seen


@pytest.mark.parametrize("stream", [False, True])  # the lean client and aiohttp's
@pytest.mark.parametrize(
    ("authorization", "client_auth", "expected"),
    [
        ("client", "Bearer sk-client", "Bearer sk-client"),  # the client's own is kept
        ("client", None, "Bearer sk-arm"),  # a client without one gets the arm's key
        ("arm", "Bearer sk-client", "Bearer sk-arm"),  # the arm's key replaces the client's
    ],
)
async def test_an_arms_headers_and_api_key_reach_only_that_arm(
    arms: Arms,
    make_proxy: MakeProxy,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    stream: bool,
    authorization: Literal["client", "arm"],
    client_auth: str | None,
    expected: str,
) -> None:
    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("GATEWAY_KEY", "sk-arm")
    own = ArmConfig(
        headers={"X-Tenant": "spec-team", "X-Keep-Me": "arm"},
        api_key_env="GATEWAY_KEY",
        authorization=authorization,
    )
    proxy = await make_proxy(routing=SPEC_ONLY, speculative=own)
    headers = {"X-Keep-Me": "client", **({"Authorization": client_auth} if client_auth else {})}
    async with proxy.client.post(CHAT, json=chat(stream=stream), headers=headers) as resp:
        assert resp.status == 200
        await resp.read()
    seen = arms.speculative.seen[-1]["headers"]
    assert seen["Authorization"] == expected
    assert seen["X-Tenant"] == "spec-team"
    assert seen["X-Keep-Me"] == "arm"  # the arm's header replaces the client's, once
    # the baseline arm has none of it (passthrough goes there)
    async with proxy.client.get("/v1/models") as resp:
        assert resp.status == 200
    base_seen = {k.lower() for k in arms.baseline.seen[-1]["headers"]}
    assert "x-tenant" not in base_seen and "authorization" not in base_seen
    assert "sk-arm" not in caplog.text


async def test_the_controls_headers_and_key_reach_it_on_forwarded_calls_too(
    arms: Arms, make_proxy: MakeProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls the proxy forwards unmeasured (GET /v1/models, ...) go to the control: behind a
    gateway that wants its key, they need the control arm's key and headers as much as the
    measured ones."""
    monkeypatch.setenv("GATEWAY_KEY", "sk-control")
    own = ArmConfig(headers={"X-Tenant": "base-team"}, api_key_env="GATEWAY_KEY")
    proxy = await make_proxy(routing=SPEC_ONLY, baseline=own)
    async with proxy.client.get("/v1/models") as resp:
        assert resp.status == 200
    seen = arms.baseline.seen[-1]
    assert seen["path"] == "/v1/models"
    assert seen["headers"]["Authorization"] == "Bearer sk-control"
    assert seen["headers"]["X-Tenant"] == "base-team"
    async with proxy.client.get("/v1/models", headers={"Authorization": "Bearer mine"}) as resp:
        assert resp.status == 200
    assert arms.baseline.seen[-1]["headers"]["Authorization"] == "Bearer mine"  # the client's


def test_for_arm_renders_the_same_headers_for_both_transports() -> None:
    raw = [(b"X-Keep-Me", b"client"), (b"Authorization", b"Bearer c"), (b"Accept", b"*/*")]
    parsed = CIMultiDict([(k.decode(), v.decode()) for k, v in raw])
    own = ArmHeaders({"X-Keep-Me": "arm"}, "sk-k", replace_authorization=True)
    for out in (OutboundHeaders(parsed, raw).for_arm(own), OutboundHeaders(parsed).for_arm(own)):
        lines = out.lines().decode().split("\r\n")[:-1]
        assert sorted(lines) == sorted(f"{k}: {v}" for k, v in out.multidict().items())
        assert sorted(lines) == ["Accept: */*", "Authorization: Bearer sk-k", "X-Keep-Me: arm"]
    plain = OutboundHeaders(parsed, raw)
    assert plain.for_arm(ArmHeaders()) is plain  # an arm that adds nothing costs nothing
    assert "sk-k" not in repr(own)
