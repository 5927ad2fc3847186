"""A recording TCP relay between the proxy and a real vLLM server, and HTTP/SSE parsing helpers.

The proxy keeps no copy of what it relays, so to prove that it relays exactly the bytes vLLM sent
*for that very request* the test puts this tap on the wire: the proxy's upstream URL points at
the tap, the tap forwards to vLLM and keeps every byte vLLM sent back, per connection. A fresh
second request could not serve as the reference: vLLM's grouping of tokens into SSE events
depends on timing (the API server merges engine outputs it has not yet sent), so two identical
greedy requests may frame their events differently.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from typing import Any
from urllib.parse import urlsplit

__all__ = [
    "RecordingTap",
    "choice_texts",
    "normalise_ids",
    "split_http_responses",
    "sse_events",
]


class RecordingTap:
    """Listens on a free loopback port and relays to `upstream_url`, recording the responses."""

    def __init__(self, upstream_url: str) -> None:
        parts = urlsplit(upstream_url)
        self._host = parts.hostname or "127.0.0.1"
        self._port = parts.port or 80
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self.received: list[bytearray] = []  # upstream -> proxy bytes, one buffer per connection
        self.url = ""

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def mark(self) -> list[int]:
        """Current length of every connection's buffer (see `responses_since`)."""
        return [len(buf) for buf in self.received]

    def responses_since(self, mark: list[int]) -> list[tuple[bytes, bytes]]:
        """HTTP responses (head, decoded body) recorded after `mark`, but the scraper's: its
        /metrics pages (text/plain) and its /v1/models listings (the model-label refresh)."""
        out: list[tuple[bytes, bytes]] = []
        for i, buf in enumerate(self.received):
            start = mark[i] if i < len(mark) else 0
            if len(buf) > start:
                out += split_http_responses(bytes(buf[start:]))
        return [
            (head, body)
            for head, body in out
            if b"text/plain" not in head.lower() and not body.startswith(b'{"object":"list"')
        ]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        buffer = bytearray()
        self.received.append(buffer)
        try:
            up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
            await asyncio.gather(_pump(reader, up_writer, None), _pump(up_reader, writer, buffer))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()


async def _pump(
    src: asyncio.StreamReader, dst: asyncio.StreamWriter, record: bytearray | None
) -> None:
    try:
        while data := await src.read(65536):
            if record is not None:
                record += data
            dst.write(data)
            await dst.drain()
    finally:
        dst.close()
        with contextlib.suppress(OSError, asyncio.CancelledError):
            await dst.wait_closed()


def split_http_responses(data: bytes) -> list[tuple[bytes, bytes]]:
    """Split a connection's server bytes into (head, body), undoing chunked encoding."""
    responses = []
    pos = 0
    while pos < len(data):
        head_end = data.index(b"\r\n\r\n", pos)
        head = data[pos:head_end]
        pos = head_end + 4
        lower = head.lower()
        body = bytearray()
        if b"transfer-encoding: chunked" in lower:
            while True:
                line_end = data.index(b"\r\n", pos)
                size = int(data[pos:line_end].split(b";")[0], 16)
                pos = line_end + 2
                if size == 0:
                    pos += 2  # the CRLF after the last chunk (vLLM sends no trailers)
                    break
                body += data[pos : pos + size]
                pos += size + 2
        else:
            match = re.search(rb"content-length: *(\d+)", lower)
            length = int(match.group(1)) if match else 0
            body += data[pos : pos + length]
            pos += length
        responses.append((head, bytes(body)))
    return responses


def sse_events(body: bytes) -> list[bytes]:
    """The data payloads of an SSE body; asserts the framing (`data: ...` blocks, [DONE] last)."""
    assert body.endswith(b"data: [DONE]\n\n"), body[-200:]
    blocks = body.split(b"\n\n")
    assert blocks[-1] == b""
    payloads = []
    for block in blocks[:-1]:
        assert block.startswith(b"data: ") and b"\n" not in block, block[:200]
        payloads.append(block[len(b"data: ") :])
    return payloads


_ID = re.compile(rb'"id":"(?:cmpl|chatcmpl)-[0-9a-f]+"')
_CREATED = re.compile(rb'"created":\d+')


def normalise_ids(data: bytes) -> bytes:
    """Blank the per-request `id` and `created` values (they differ between any two requests)."""
    return _CREATED.sub(b'"created":0', _ID.sub(b'"id":"-"', data))


def choice_texts(payloads: list[bytes]) -> dict[int, str]:
    """Generated text per choice index, concatenated over the events (completions or chat)."""
    texts: dict[int, str] = {}
    for payload in payloads:
        if payload == b"[DONE]":
            continue
        for choice in json.loads(payload)["choices"]:
            piece = choice.get("text")
            if piece is None:
                piece = (choice.get("delta") or {}).get("content")
            texts[choice["index"]] = texts.get(choice["index"], "") + (piece or "")
    return texts
