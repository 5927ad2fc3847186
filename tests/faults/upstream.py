"""A fault-injecting vLLM stand-in on raw asyncio (port 0): every fault the proxy must survive.

The fault is picked per request by the `x-fault` request header, which the proxy forwards like
any client header (so one upstream serves a whole test). It answers /health and /metrics too, so
the proxy's probes and scraper see a live engine. Faults (`FAULTS`):

    ok                    200 JSON completion with usage (the fixture body)
    sse                   200 event stream of the fixture (valid, usage chunk, [DONE])
    reset_before_headers  TCP RST right after the request was read
    reset_after_headers   stream headers, then RST
    reset_mid_stream      headers and a few events, then RST
    stall_before_headers  nothing, until the proxy gives up
    stall_mid_stream      headers and a few events, then nothing
    drip                  stream headers, then one byte of a never-ending event every DRIP_S
    drip_body             non-stream headers announcing a large body, one byte every DRIP_S
    garbage_sse           200 text/event-stream of random bytes (no `data:` line), then close
    truncated_chunked     a chunked JSON body cut before its last chunk
    error_503             503 with vLLM's JSON error body
    huge_body             a 100 MB JSON body (Content-Length), in 1 MiB writes
    slow_sse              the fixture stream, one event every SLOW_S (SIGTERM under load)
    endless_sse           content events every SLOW_S until the proxy hangs up (disconnects)
    big_sse               a valid BIG_SSE_BYTES stream of content events (slow readers)
    huge_event            one HUGE_BYTES content event in 1 MiB chunks, then [DONE]

Counters say what happened on the upstream side: requests per fault, streams that ended
because the proxy closed the connection (`aborted`), and stream bytes written (`streamed`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import struct
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from tests.conftest import fixture_path

__all__ = [
    "BIG_SSE_BYTES",
    "DRIP_S",
    "FAULTS",
    "HUGE_BYTES",
    "SLOW_S",
    "FaultUpstream",
    "blackholed_url",
    "padded_metrics_page",
]

DRIP_S: Final = 0.05
SLOW_S: Final = 0.05
HUGE_BYTES: Final = 100 * 1024 * 1024
BIG_SSE_BYTES: Final = 20 * 1024 * 1024
FAULTS: Final = (
    "ok",
    "sse",
    "reset_before_headers",
    "reset_after_headers",
    "reset_mid_stream",
    "stall_before_headers",
    "stall_mid_stream",
    "drip",
    "drip_body",
    "garbage_sse",
    "truncated_chunked",
    "error_503",
    "huge_body",
    "slow_sse",
    "endless_sse",
    "big_sse",
    "huge_event",
)

_SSE: Final = fixture_path("chat_stream_usage_baseline.sse").read_bytes()
_EVENTS: Final = [e + b"\n\n" for e in _SSE.split(b"\n\n") if e.strip()]
_BODY: Final = fixture_path("chat_nonstream_baseline.json").read_bytes()
_ERROR: Final = fixture_path("error_unknown_model.json").read_bytes()
_METRICS: Final = fixture_path("metrics_baseline.prom").read_bytes()


@contextlib.contextmanager
def blackholed_url() -> Iterator[str]:
    """A URL whose connects time out, as a black-holed address's do: a listener with a full
    backlog that never accepts (later SYNs are dropped: tcp_abort_on_overflow=0)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):  # fill the accept queue
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(("127.0.0.1", port))
        fillers.append(filler)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for sock in [*fillers, listener]:
            sock.close()


def padded_metrics_page(target_bytes: int) -> bytes:
    """A valid vLLM page (speculative metrics) padded with `vllm:` gauge samples of distinct
    engines (the lines the parser keeps) to about `target_bytes`."""
    page = bytearray(fixture_path("metrics_spec.prom").read_bytes())
    i = 0
    while len(page) < target_bytes:
        page += f'vllm:num_requests_running{{engine="{i}",model_name="m"}} 1.0\n'.encode()
        i += 1
    return bytes(page)


def _head(status: int, reason: str, headers: dict[str, str]) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason}", "server: fault-upstream"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json_head(status: int, reason: str, *, length: int | None) -> bytes:
    """A JSON answer's head: Content-Length framing, or chunked when `length` is None."""
    framing = (
        {"transfer-encoding": "chunked"} if length is None else {"content-length": str(length)}
    )
    return _head(status, reason, {"content-type": "application/json", **framing})


_STREAM_HEAD: Final = _head(  # as uvicorn frames vLLM's streams: chunked
    200, "OK", {"content-type": "text/event-stream; charset=utf-8", "transfer-encoding": "chunked"}
)
_LAST_CHUNK: Final = b"0\r\n\r\n"


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


@dataclass
class FaultUpstream:
    """The server; `url` once started. Use as `async with FaultUpstream() as up:`."""

    seed: int = 0
    host: str = "127.0.0.1"  # any loopback address (127.0.0.0/8)
    metrics: bytes = _METRICS  # the /metrics page (`padded_metrics_page`: a huge one)
    requests: Counter[str] = field(default_factory=Counter)
    aborted: int = 0
    streamed: int = 0
    open_connections: int = 0
    url: str = ""
    _server: asyncio.Server | None = None
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def __aenter__(self) -> FaultUpstream:
        # A head as large as the proxy lets through (its 64 KiB of client headers, plus its own).
        self._server = await asyncio.start_server(self._serve, self.host, 0, limit=1 << 20)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{self.host}:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
        await self._server.wait_closed()

    # ---------------------------------------------------------------------------------- server

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open_connections += 1
        try:
            while True:  # keep-alive: one request after another
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                path = lines[0].split(" ", 2)[1]
                headers = {
                    k.strip().lower(): v.strip()
                    for k, _, v in (line.partition(":") for line in lines[1:] if line)
                }
                length = int(headers.get("content-length", "0"))
                if length:
                    await reader.readexactly(length)
                if path == "/health":
                    writer.write(_head(200, "OK", {"content-length": "0"}))
                elif path == "/metrics":
                    writer.write(_head(200, "OK", {"content-length": str(len(self.metrics))}))
                    writer.write(self.metrics)
                elif path == "/v1/models":
                    body = json.dumps({"object": "list", "data": [{"id": "tiny-llama"}]}).encode()
                    writer.write(_head(200, "OK", {"content-length": str(len(body))}) + body)
                else:
                    fault = headers.get("x-fault", "ok")
                    self.requests[fault] += 1
                    if not await self._fault(fault, writer):
                        return
                await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)
            writer.transport.abort()

    async def _fault(self, fault: str, writer: asyncio.StreamWriter) -> bool:
        """Answer one request with `fault`; False when the connection is done."""
        if fault == "ok":
            writer.write(_json_head(200, "OK", length=len(_BODY)) + _BODY)
            return True
        if fault == "error_503":
            writer.write(_json_head(503, "Service Unavailable", length=len(_ERROR)) + _ERROR)
            return True
        if fault == "reset_before_headers":
            _reset(writer)
            return False
        if fault == "stall_before_headers":
            await _forever()
        if fault == "truncated_chunked":
            writer.write(_json_head(200, "OK", length=None))
            writer.write(_chunk(_BODY[:100]))
            await writer.drain()
            writer.close()  # EOF before the rest and the terminal chunk
            return False
        if fault == "drip_body":
            writer.write(_json_head(200, "OK", length=len(_BODY) * 1000))
            while True:
                writer.write(b" ")
                await self._drain(writer)
                await asyncio.sleep(DRIP_S)
        if fault == "huge_body":
            writer.write(_json_head(200, "OK", length=HUGE_BYTES))
            block = b" " * (1 << 20)
            for _ in range(HUGE_BYTES >> 20):
                writer.write(block)
                await self._drain(writer)
            return True
        # Streams.
        writer.write(_STREAM_HEAD)
        await self._drain(writer)
        if fault == "reset_after_headers":
            _reset(writer)
            return False
        if fault == "garbage_sse":
            rng = random.Random(self.seed)
            for _ in range(64):
                junk = bytes(rng.randrange(256) for _ in range(512))
                writer.write(_chunk(junk.replace(b"data:", b"dat?:")))
                await self._drain(writer)
            writer.write(_LAST_CHUNK)  # a properly framed end: only the content is garbage
            await self._drain(writer)
            return True
        if fault == "drip":
            writer.write(_chunk(b'data: {"choices": ['))
            while True:
                writer.write(_chunk(b" "))
                await self._drain(writer)
                await asyncio.sleep(DRIP_S)
        if fault in ("reset_mid_stream", "stall_mid_stream"):
            writer.write(_chunk(b"".join(_EVENTS[:3])))
            await self._drain(writer)
            if fault == "reset_mid_stream":
                _reset(writer)
                return False
            await _forever()
        if fault == "endless_sse":
            event = _EVENTS[1]  # a content event
            while True:
                writer.write(_chunk(event))
                await self._drain(writer)
                await asyncio.sleep(SLOW_S)
        if fault == "big_sse":
            batch = b"".join(_EVENTS[1:2] * 64)  # content events, one chunk of 64
            for _ in range(BIG_SSE_BYTES // len(batch)):
                await self._stream_chunk(writer, batch)
            await self._stream_chunk(writer, _EVENTS[-1])  # data: [DONE]
        elif fault == "huge_event":
            await self._stream_chunk(writer, b'data: {"choices":[{"index":0,"delta":{"content":"')
            block = b"x" * (1 << 20)
            for _ in range(HUGE_BYTES >> 20):
                await self._stream_chunk(writer, block)
            await self._stream_chunk(writer, b'"}}]}\n\n' + _EVENTS[-1])
        elif fault == "slow_sse":
            for event in _EVENTS:
                writer.write(_chunk(event))
                await self._drain(writer)
                await asyncio.sleep(SLOW_S)
        else:  # "sse" and any unknown name: the valid stream
            writer.write(_chunk(_SSE))
        writer.write(_LAST_CHUNK)
        await self._drain(writer)
        return True

    async def _stream_chunk(self, writer: asyncio.StreamWriter, data: bytes) -> None:
        writer.write(_chunk(data))
        await self._drain(writer)
        self.streamed += len(data)

    async def _drain(self, writer: asyncio.StreamWriter) -> None:
        try:
            await writer.drain()
        except ConnectionError:
            self.aborted += 1
            raise
        if writer.transport.is_closing():
            self.aborted += 1
            raise ConnectionResetError("the proxy closed the connection")


async def _forever() -> None:
    await asyncio.Event().wait()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a TCP RST (SO_LINGER 0), as a crashed process's kernel does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()
