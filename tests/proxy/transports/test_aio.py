"""The aiohttp transport: aiohttp's exceptions become the tree of `specproxy.errors`, once."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest
from aiohttp import web
from multidict import CIMultiDict
from pytest_aiohttp import AiohttpServer

from specproxy.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamTimeout,
)
from specproxy.proxy.headers import OutboundHeaders
from specproxy.proxy.transports.aio import AiohttpTransport, upstream_error

NO_LIMIT = aiohttp.ClientTimeout(total=None)
HEADERS = OutboundHeaders(CIMultiDict({"X-Keep": "1", "Connection": "close"}))


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (aiohttp.ServerTimeoutError("read"), UpstreamTimeout),
        (aiohttp.ConnectionTimeoutError("connect"), UpstreamConnectTimeout),  # nothing sent
        (TimeoutError(), UpstreamTimeout),
        (
            aiohttp.ClientConnectorError(
                aiohttp.client_reqrep.ConnectionKey("h", 1, False, True, None, None, None),
                OSError(111, "refused"),
            ),
            UpstreamConnectError,
        ),
        (ConnectionRefusedError(), UpstreamConnectError),
        (aiohttp.ServerDisconnectedError(), UpstreamBroken),
        (aiohttp.ClientPayloadError("cut"), UpstreamBroken),
        (aiohttp.ClientOSError(104, "reset"), UpstreamBroken),
    ],
)
def test_upstream_error_maps_each_aiohttp_failure(
    exc: BaseException, expected: type[UpstreamError]
) -> None:
    mapped = upstream_error(exc)
    assert type(mapped) is expected
    assert upstream_error(mapped) is mapped  # already mapped: unchanged


async def test_send_reads_the_answer_and_forwards_the_headers(
    aiohttp_server: AiohttpServer,
) -> None:
    seen: list[web.Request] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request)
        return web.Response(body=b"hello " + await request.read(), headers={"X-Up": "2"})

    app = web.Application()
    app.router.add_post("/base/v1/x", handle)
    server = await aiohttp_server(app)
    async with aiohttp.ClientSession() as session:
        transport = AiohttpTransport(str(server.make_url("/base")), session, NO_LIMIT)
        reply = await transport.send("POST", "/v1/x?q=1", b"world", HEADERS)
        assert (reply.status, reply.headers["X-Up"], reply.content_length) == (200, "2", 11)
        assert await reply.read() == b"hello world"
        reply.release()
        await transport.close()
    assert seen[0].path_qs == "/base/v1/x?q=1"
    assert seen[0].headers["X-Keep"] == "1"  # forwarded; Connection is hop-by-hop: not
    assert seen[0].headers.get("Connection") != "close"


async def test_refused_is_a_connect_error_that_was_never_sent() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    async with aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamConnectError) as caught:
            await AiohttpTransport(url, session, NO_LIMIT).send("POST", "/v1/x", b"", HEADERS)
    assert caught.value.never_sent and caught.value.kind == "connect"


async def test_a_body_cut_short_is_broken_and_silence_is_a_timeout() -> None:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npartial")
        await writer.drain()
        writer.close()  # 93 bytes short
        await writer.wait_closed()

    listener = await asyncio.start_server(script, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    async with listener, aiohttp.ClientSession() as session:
        reply = await AiohttpTransport(url, session, NO_LIMIT).send("POST", "/v1/x", b"", HEADERS)
        assert await reply.readany() == b"partial"
        with pytest.raises(UpstreamBroken):
            await reply.readany()
        reply.close()

    done, closed = asyncio.Event(), asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        await done.wait()
        writer.close()
        await writer.wait_closed()
        closed.set()

    listener = await asyncio.start_server(silent, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}"
    silence = aiohttp.ClientTimeout(sock_read=0.1)  # the transport's, not the session's
    async with listener, aiohttp.ClientSession() as session:
        with pytest.raises(UpstreamTimeout):
            await AiohttpTransport(url, session, silence).send("POST", "/v1/x", b"", HEADERS)
        done.set()
        await closed.wait()
