"""Which headers cross the proxy, and which paths it refuses to proxy."""

from __future__ import annotations

import asyncio
import logging

import pytest

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
