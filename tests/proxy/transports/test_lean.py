"""The lean upstream client against scripted raw-socket servers, and through the proxy.

Each server is an `asyncio.start_server` on port 0 running a script: it reads requests and writes
exactly the bytes a test wants (valid, garbage, truncated, closing), so every framing and failure
path is driven deterministically.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from specproxy.config import ArmConfig
from specproxy.errors import UpstreamBroken, UpstreamConnectError
from specproxy.proxy.transports.lean import UpstreamPool, UpstreamResponse
from tests.proxy.conftest import MakeProxy

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]
OK_BODY = b'{"ok":true}'
OK = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n" + OK_BODY


class Server:
    """A scripted upstream; counts connections and requests."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[bytes] = []
        self.request_conns: list[int] = []  # which connection (1, 2, ...) carried each request
        self._conn_of: dict[int, int] = {}
        self.port = 0

    async def read_request(self, reader: asyncio.StreamReader) -> bytes | None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return None
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        request = head + await reader.readexactly(length)
        self.requests.append(request)
        self.request_conns.append(self._conn_of[id(reader)])
        return request

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._conn_of[id(reader)] = self.connections
        try:
            await self.script(reader, writer)
        finally:
            writer.close()


@contextlib.asynccontextmanager
async def serve(script: Callable[[Server], Script]) -> AsyncIterator[Server]:
    server = Server(lambda r, w: asyncio.sleep(0))
    server.script = script(server)
    listener = await asyncio.start_server(server._handle, "127.0.0.1", 0)
    server.port = listener.sockets[0].getsockname()[1]
    async with listener:
        yield server


def pool_for(server: Server, **kwargs: float) -> UpstreamPool:
    return UpstreamPool(
        "127.0.0.1",
        server.port,
        connect_timeout=kwargs.get("connect", 2.0),
        read_timeout=kwargs.get("read", 2.0),
        idle_timeout_s=kwargs.get("idle", 4.0),
    )


def replying(*responses: bytes, close_after: bool = False) -> Callable[[Server], Script]:
    """Answer each request on a connection with the next response; the last one repeats."""

    def script(server: Server) -> Script:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            i = 0
            while await server.read_request(reader) is not None:
                for piece in _pieces(responses[min(i, len(responses) - 1)]):
                    writer.write(piece)
                    await writer.drain()
                i += 1
                if close_after:
                    return

        return run

    return script


def _pieces(response: bytes) -> list[bytes]:
    """Split a response on b"|" markers into separate writes (to cut frames anywhere)."""
    return response.split(b"|") if b"|" in response else [response]


HEADERS = [("Content-Type", "application/json"), ("Authorization", "Bearer k")]


# --------------------------------------------------------------------------- framing


async def test_content_length_body_and_keep_alive_reuse() -> None:
    async with serve(replying(OK)) as server:
        pool = pool_for(server)
        for _ in range(3):
            resp = await pool.post("/v1/chat/completions", b'{"a":1}', HEADERS)
            assert (resp.status, resp.reason, resp.content_length) == (200, "OK", 11)
            assert resp.headers["content-type"] == "application/json"
            assert await resp.read() == OK_BODY
            resp.release()
        assert server.connections == 1 and len(server.requests) == 3
        assert pool.idle_connections == 1
        first = server.requests[0]
        assert first.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{server.port}\r\n".encode() in first
        assert b"Authorization: Bearer k\r\nContent-Length: 7\r\n\r\n" in first
        assert first.endswith(b'{"a":1}')
        await pool.close()
        assert pool.idle_connections == 0


async def test_chunked_body_split_anywhere_with_extensions_and_trailers() -> None:
    body = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;ext=1\r\nhel|lo\r|\n|6\r\n wor|ld\r\n0\r\nX-Trailer: t\r\n\r|\n"
    )
    async with serve(replying(body)) as server:
        pool = pool_for(server)
        for _ in range(2):
            resp = await pool.post("/x", b"", HEADERS)
            assert resp.content_length is None
            assert await resp.read() == b"hello world"
            resp.release()
        assert server.connections == 1  # a complete chunked body leaves the connection reusable


async def test_at_eof_is_true_once_the_last_body_byte_was_returned() -> None:
    """Length framing: exactly after the piece with the last byte. Chunked: never while body
    bytes remain, and by the time `readany` says b"". Until close: only at the close. The
    server sends its next piece only once the client read one, so every prefix is seen."""
    length = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhel|lo |world"
    chunked = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5\r\nhello\r\n|6\r\n world\r\n|0\r\n\r\n"
    )
    until_close = b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhello| world"
    for response, exact in ((length, True), (chunked, False), (until_close, False)):
        read: asyncio.Queue[None] = asyncio.Queue()

        def gated(
            server: Server, response: bytes = response, read: asyncio.Queue[None] = read
        ) -> Script:
            async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
                await server.read_request(reader)
                for piece in _pieces(response):
                    writer.write(piece)
                    await writer.drain()
                    if b"0\r\n\r\n" not in piece:  # the client waits for nothing after it
                        await read.get()

            return run

        async with serve(gated) as server:
            pool = pool_for(server)
            resp = await pool.post("/x", b"", HEADERS)
            got, states = b"", []
            while piece := await resp.readany():
                got += piece
                states.append((got, resp.at_eof()))
                read.put_nowait(None)
            assert got == b"hello world" and resp.at_eof()
            assert len(states) >= 2 and not states[0][1]  # a body seen in parts
            assert all(not eof for seen, eof in states if seen != got)
            if exact:
                assert states[-1][1]
            resp.release()
            await pool.close()


async def test_read_nowait_returns_the_body_bytes_already_here_and_never_waits() -> None:
    gate: asyncio.Queue[None] = asyncio.Queue()

    def gated(server: Server) -> Script:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            for piece in (
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                b"5\r\nhel",
                b"lo\r\n0\r\n\r\n",
            ):
                writer.write(piece)
                await writer.drain()
                await gate.get()

        return run

    async def arrived(resp: UpstreamResponse) -> bytes:
        for _ in range(3000):  # the bytes are on their way: wait for them (30 s at most)
            if piece := resp.read_nowait():
                return piece
            await asyncio.sleep(0.01)
        raise AssertionError("no body bytes arrived")

    async with serve(gated) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        assert resp.read_nowait() == b"" and not resp.at_eof()  # only the headers were sent
        gate.put_nowait(None)
        assert await arrived(resp) == b"hel" and not resp.at_eof()
        gate.put_nowait(None)
        assert await arrived(resp) == b"lo" and resp.at_eof()
        assert resp.read_nowait() == b"" and await resp.readany() == b""
        gate.put_nowait(None)
        resp.release()
        assert server.connections == 1 and pool.idle_connections == 1
        await pool.close()


async def test_body_until_close_is_read_and_the_connection_not_reused() -> None:
    async with serve(replying(b"HTTP/1.1 200 OK\r\n\r\nall of it", close_after=True)) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        assert await resp.read() == b"all of it"
        resp.release()
        assert pool.idle_connections == 0


async def test_connection_close_and_http10_responses_are_not_pooled() -> None:
    closing = b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok"
    old = b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok"
    for response in (closing, old):
        async with serve(replying(response)) as server:
            pool = pool_for(server)
            for _ in range(2):
                resp = await pool.post("/x", b"", HEADERS)
                assert await resp.read() == b"ok"
                resp.release()
            assert server.connections == 2 and pool.idle_connections == 0


async def test_interim_100_continue_is_skipped() -> None:
    async with serve(replying(b"HTTP/1.1 100 Continue\r\n\r\n" + OK)) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        assert resp.status == 200 and await resp.read() == OK_BODY
        resp.close()


async def test_no_content_has_an_empty_body() -> None:
    async with serve(replying(b"HTTP/1.1 204 No Content\r\n\r\n")) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        assert resp.status == 204 and await resp.read() == b""
        resp.release()
        assert pool.idle_connections == 1


# --------------------------------------------------------------------------- failures


async def test_upstream_closing_an_idle_connection_is_noticed_and_a_new_one_used() -> None:
    async with serve(replying(OK, close_after=True)) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        assert await resp.read() == OK_BODY
        resp.release()  # pooled: the response allowed keep-alive...
        for _ in range(100):  # ...but the server closes it; the pool drops it when it sees that
            if pool.idle_connections == 0:
                break
            await asyncio.sleep(0.01)
        assert pool.idle_connections == 0
        resp = await pool.post("/x", b"", HEADERS)
        assert await resp.read() == OK_BODY
        assert server.connections == 2 and len(server.requests) == 2


async def test_an_idle_connection_that_received_stray_bytes_is_not_reused() -> None:
    """Bytes that arrive on an idle connection (say a 408 before the server closes) would be
    read as the next request's response; such a connection is dropped instead."""

    def script(server: Server) -> Script:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            writer.write(OK)
            await writer.drain()
            await asyncio.sleep(0.02)  # the client has pooled the connection by now
            writer.write(b"HTTP/1.1 408 Request Timeout\r\nContent-Length: 0\r\n\r\n")
            await writer.drain()
            while await server.read_request(reader) is not None:
                writer.write(OK)

        return run

    async with serve(script) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        assert await resp.read() == OK_BODY
        resp.release()
        await asyncio.sleep(0.1)  # the 408 arrives while the connection is idle in the pool
        resp = await pool.post("/x", b"", HEADERS)
        assert resp.status == 200 and await resp.read() == OK_BODY
        assert server.connections == 2


async def test_connections_idle_too_long_are_not_reused() -> None:
    async with serve(replying(OK)) as server:
        pool = pool_for(server, idle=0.0)
        for _ in range(2):
            resp = await pool.post("/x", b"", HEADERS)
            await resp.read()
            resp.release()
        assert server.connections == 2


async def test_close_after_the_request_was_written_is_broken_and_never_retried() -> None:
    def script(server: Server) -> Script:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)  # read it, answer nothing, close

        return run

    async with serve(script) as server:
        pool = pool_for(server)
        with pytest.raises(UpstreamBroken, match="without a response"):
            await pool.post("/x", b"{}", HEADERS)
        assert len(server.requests) == 1  # exactly once: a POST may have started a generation


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "bad status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n", "Content-Length"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "Content-Length"),
        ("HTTP/1.1 200 OK\r\nContent-Length: \u00b2\r\n\r\n".encode("latin-1"), "Content-Length"),
    ],
)
async def test_garbage_heads_are_broken(response: bytes, message: str) -> None:
    async with serve(replying(response)) as server:
        pool = pool_for(server)
        with pytest.raises(UpstreamBroken, match=message):
            await pool.post("/x", b"", HEADERS)


@pytest.mark.parametrize(
    ("response", "message"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b", "mid-body"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel", "mid-body"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\n", "bad chunk size"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhiXX", "CRLF"),
    ],
)
async def test_partial_and_garbage_bodies_are_broken(response: bytes, message: str) -> None:
    async with serve(replying(response, close_after=True)) as server:
        pool = pool_for(server)
        resp = await pool.post("/x", b"", HEADERS)
        with pytest.raises(UpstreamBroken, match=message):
            await resp.read()
        resp.close()


async def test_closed_inside_the_headers_is_broken() -> None:
    async with serve(replying(b"HTTP/1.1 200 OK\r\nContent-Le", close_after=True)) as server:
        with pytest.raises(UpstreamBroken, match="inside the headers"):
            await pool_for(server).post("/x", b"", HEADERS)


async def test_read_timeout_and_refused_connection() -> None:
    def silent(server: Server) -> Script:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            await asyncio.sleep(5)

        return run

    async with serve(silent) as server:
        pool = pool_for(server, read=0.1)
        with pytest.raises(TimeoutError):
            await pool.post("/x", b"", HEADERS)
        assert pool.idle_connections == 0
    refused = UpstreamPool("127.0.0.1", server.port, connect_timeout=1.0, read_timeout=1.0)
    with pytest.raises(UpstreamConnectError):
        await refused.post("/x", b"", HEADERS)


async def test_a_cancelled_call_closes_its_connection() -> None:
    received, closed = asyncio.Event(), asyncio.Event()

    def script(server: Server) -> Script:
        async def run(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await server.read_request(reader)
            received.set()
            await reader.read()  # until the client closes
            closed.set()

        return run

    async with serve(script) as server:
        pool = pool_for(server)
        task = asyncio.create_task(pool.post("/x", b"", HEADERS))
        await asyncio.wait_for(received.wait(), 2.0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(closed.wait(), 2.0)
        assert pool.idle_connections == 0


# --------------------------------------------------------------------------- through the proxy


CHAT = "/v1/chat/completions"
SPEC_ONLY = {"speculative_share": 1.0}


@pytest.mark.parametrize(
    "response",
    [
        b"garbage\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\ntruncated",
    ],
)
async def test_proxy_maps_broken_non_stream_responses_to_502_with_one_record(
    make_proxy: MakeProxy, response: bytes
) -> None:
    async with serve(replying(response, close_after=True)) as server:
        url = f"http://127.0.0.1:{server.port}"
        proxy = await make_proxy(routing=SPEC_ONLY, speculative_url=url)
        async with proxy.client.post(CHAT, json={"model": "m", "messages": []}) as resp:
            assert resp.status == 502
            assert (await resp.json())["error"]["type"] == "BadGateway"
    assert len(proxy.recorder.records) == 1
    rec = proxy.recorder.records[0]
    assert (rec.status, rec.error_kind, rec.stream) == (502, "broken", False)


async def test_proxy_non_stream_refused_is_502_connect(make_proxy: MakeProxy) -> None:
    async with serve(replying(OK)) as server:
        url = f"http://127.0.0.1:{server.port}"
    # on_down = "error": the refusal reaches the client (the default fails open to the control)
    proxy = await make_proxy(
        routing=SPEC_ONLY, speculative_url=url, speculative=ArmConfig(on_down="error")
    )
    async with proxy.client.post(CHAT, json={"model": "m", "messages": []}) as resp:
        assert resp.status == 502
    rec = proxy.recorder.records[-1]
    assert (rec.status, rec.error_kind) == (502, "connect")


async def test_proxy_chunked_non_stream_response_is_forwarded(make_proxy: MakeProxy) -> None:
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n"
    chunked += b'\r\n7\r\n{"usage\r\n1a\r\n":{"completion_tokens":3}}\r\n0\r\n\r\n'
    async with serve(replying(chunked)) as server:
        url = f"http://127.0.0.1:{server.port}"
        proxy = await make_proxy(routing=SPEC_ONLY, speculative_url=url)
        for _ in range(2):
            async with proxy.client.post(CHAT, json={"model": "m", "messages": []}) as resp:
                assert resp.status == 200
                assert await resp.read() == b'{"usage":{"completion_tokens":3}}'
        # The pooled connection was reused (the proxy's scraper opens its own for GET /metrics).
        posts = [
            i
            for i, r in zip(server.request_conns, server.requests, strict=True)
            if r.startswith(b"POST")
        ]
        assert len(posts) == 2 and len(set(posts)) == 1
    assert [r.status for r in proxy.recorder.records] == [200, 200]


def test_runs_on_uvloop_like_serve() -> None:
    """`specproxy serve` runs on uvloop, whose transports are not `asyncio.Transport`
    subclasses; the pool must work there too (a fresh connection, then reused ones)."""
    import uvloop

    async def main() -> int:
        async with serve(replying(OK)) as server:
            pool = pool_for(server)
            for _ in range(3):
                resp = await pool.post("/x", b"{}", HEADERS)
                assert await resp.read() == OK_BODY
                resp.release()
            await pool.close()
            return server.connections

    assert uvloop.run(main()) == 1
