"""Relaying an upstream answer to the client, timed on the side, and the proxy's own answers.

Upstream bytes reach the client as they arrive and unmodified (the one exception: the usage
event the proxy itself asked for is removed, see `sse`). A stream that breaks mid-way is cut off
the same way for the client (no synthetic end). "Last byte written" is a real timestamp: the
response is finished here, not by aiohttp after the handler returns.

Backpressure: a write waits (aiohttp drains every 64 KiB) while the client's transport is
above its high-water mark, and no upstream read happens meanwhile; each transport then pauses
reading its socket once its own buffer is full (`lean`: `_Connection`; aiohttp's reader
likewise), so a client that does not read holds about one buffer per stream, not the stream.
An event larger than `max_event_bytes` ends the stream: the upstream is closed, the client's
response is finished properly (no reset), and the record is `event_too_large`.
"""

from __future__ import annotations

import time
from collections.abc import Coroutine
from typing import Any, Final

from aiohttp import web

from specproxy.errors import ErrorKind, UpstreamError, error_body
from specproxy.proxy.headers import (
    ARM_HEADER,
    REQUEST_ID_HEADER,
    is_event_stream,
    response_headers,
)
from specproxy.proxy.limits import ALLOW_HEADER, MAX_JSON_DEPTH
from specproxy.proxy.sse import MAX_EVENT_BYTES, SSEScanner
from specproxy.proxy.trace import STATUS_CLIENT_GONE, Trace
from specproxy.proxy.transports.base import Reply
from specproxy.proxy.usage import usage_of
from specproxy.records import Arm

__all__ = [
    "bad_request",
    "cut_off",
    "headers_too_large",
    "json_error",
    "method_not_allowed",
    "relay",
    "send_error",
    "too_deep",
    "too_large",
    "upstream_error_response",
    "write_eof",
]

_BUFFER_LIMIT: Final = 8 * 1024 * 1024  # non-stream bodies up to this size are sent in one write


def relay(
    request: web.Request,
    trace: Trace,
    upstream: Reply,
    strip_usage: bool,
    max_event_bytes: int = MAX_EVENT_BYTES,
) -> Coroutine[Any, Any, web.StreamResponse]:
    """Send the upstream's answer to the client: streamed, or buffered when small and framed.

    The coroutine that does it, not one wrapping it: a frame less on every request."""
    if is_event_stream(upstream.content_type):
        return _stream(request, trace, upstream, strip_usage, max_event_bytes, events=True)
    return _buffered(request, trace, upstream)


async def _stream(
    request: web.Request,
    trace: Trace,
    upstream: Reply,
    strip_usage: bool,
    max_event_bytes: int = MAX_EVENT_BYTES,
    *,
    events: bool,
) -> web.StreamResponse:
    """Relay the body as it comes; `events`: it is an event stream (`is_event_stream`), scanned
    and checked for defects."""
    resp = web.StreamResponse(
        status=upstream.status,
        reason=upstream.reason,
        headers=response_headers(upstream.forwarded, trace.arm, trace.request_id),
    )
    scanner = trace.scanner = SSEScanner(strip_usage=strip_usage, max_event_bytes=max_event_bytes)
    # The per-event loop: a read, a clock reading, a byte scan, a write; names bound once.
    perf_counter = time.perf_counter
    readany = upstream.readany
    at_eof = upstream.at_eof
    # A large non-stream body comes here too: it has no events, and is never scanned (held).
    feed = scanner.feed if events else _unscanned
    # Body bytes that came with the headers (or an error in them, raised in the loop below).
    first: bytes | UpstreamError
    try:
        first = upstream.read_nowait()
    except UpstreamError as exc:
        first = exc
    held = bool(first) and not isinstance(first, UpstreamError)
    if held:
        # The headers wait for the first write, which follows at once, as web.Response's do:
        # one send for both. (Otherwise aiohttp sends them at `prepare`, for an engine still
        # computing its first event; and so does the loop, if that piece completes no event.)
        resp._send_headers_immediately = False
    try:
        await resp.prepare(request)
    except ConnectionError:
        trace.disconnected = True
        trace.fail(ErrorKind.DISCONNECTED, STATUS_CLIENT_GONE)
        return resp
    write = resp.write
    now: float | None = None  # arrival of the last chunk
    last = b""  # the body's last piece, sent with the response's end in one write
    while True:
        try:
            if first:
                if isinstance(first, UpstreamError):
                    raise first
                chunk, first = first, b""
            else:
                chunk = await readany()
        except UpstreamError as exc:
            trace.upstream_end = perf_counter()
            trace.fail(exc.kind)
            await _flush(resp, scanner.finish())
            cut_off(request)
            trace.e2e_end = perf_counter()
            return resp
        if not chunk:
            break
        now = perf_counter()
        out = feed(chunk, now)
        if at_eof():  # nothing follows: the headers (if still held), it and the end go together
            last = out
            if scanner.oversized:
                upstream.close()
            break
        if out or held:
            held = False
            try:
                await write(out)
            except ConnectionError:
                trace.upstream_end = now
                trace.disconnected = True
                trace.fail(ErrorKind.DISCONNECTED)
                trace.e2e_end = perf_counter()
                return resp
        if scanner.oversized:
            upstream.close()  # the rest of the stream is not read (`release` then closes)
            break
    if now is not None:
        trace.upstream_end = now
    tail = scanner.finish()
    if scanner.oversized:
        trace.fail(ErrorKind.EVENT_TOO_LARGE)
    elif upstream.status == 200 and events:
        defect = scanner.defect()  # relayed as it came, but never a usable sample
        if defect is not None:
            trace.fail(defect)
    if not await write_eof(resp, last=last + tail if tail else last):
        trace.disconnected = True
        trace.fail(ErrorKind.DISCONNECTED)
    trace.e2e_end = perf_counter()
    return resp


def _unscanned(chunk: bytes, now: float) -> bytes:
    return chunk


async def _buffered(request: web.Request, trace: Trace, upstream: Reply) -> web.StreamResponse:
    length = upstream.content_length
    if length is None or length > _BUFFER_LIMIT:
        return await _stream(request, trace, upstream, strip_usage=False, events=False)
    try:
        payload = await upstream.read()
    except UpstreamError as exc:
        trace.fail(exc.kind)
        trace.status = exc.status  # what the client gets: nothing was sent yet
        return await send_error(request, trace, exc)
    trace.upstream_end = time.perf_counter()
    resp = web.Response(
        body=payload,
        status=upstream.status,
        reason=upstream.reason,
        headers=response_headers(upstream.forwarded, trace.arm, trace.request_id),
    )
    try:  # `write_eof` inlined: one coroutine frame less on the hot path
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        trace.disconnected = True
        trace.fail(ErrorKind.DISCONNECTED)
    trace.e2e_end = time.perf_counter()
    if upstream.status == 200:  # measured once the client has its answer: no added latency
        trace.non_stream_usage, trace.speculative = usage_of(payload)
    return resp


async def send_error(request: web.Request, trace: Trace, exc: UpstreamError) -> web.StreamResponse:
    """Answer an upstream failure that happened before any byte reached the client."""
    resp = upstream_error_response(exc, trace.request_id, trace.arm)
    if not await write_eof(resp, request):
        trace.disconnected = True
    trace.e2e_end = time.perf_counter()
    return resp


async def _flush(resp: web.StreamResponse, data: bytes) -> bool:
    if not data:
        return True
    try:
        await resp.write(data)
    except ConnectionError:
        return False
    return True


async def write_eof(
    resp: web.StreamResponse, request: web.Request | None = None, *, last: bytes = b""
) -> bool:
    """Finish a response ourselves, so that 'last byte written' is a real timestamp; `last`, the
    body's remaining bytes, goes in the same write as the end (and the headers, if unsent)."""
    try:
        if request is not None:
            await resp.prepare(request)
        await resp.write_eof(last)
    except ConnectionError:
        return False
    return True


def cut_off(request: web.Request) -> None:
    """End the client's response the way a broken upstream ended ours: close mid-body."""
    transport = request.transport
    if transport is not None:
        transport.close()


def json_error(
    status: int, error_type: str, message: str, request_id: str, arm: Arm | None = None
) -> web.Response:
    """An OpenAI-style JSON error answered by the proxy itself."""
    headers = {REQUEST_ID_HEADER: request_id}
    if arm is not None:
        headers[ARM_HEADER] = arm
    return web.Response(
        body=error_body(message, status=status, error_type=error_type),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def upstream_error_response(exc: UpstreamError, request_id: str, arm: Arm) -> web.Response:
    """The client's answer to an engine failure before any byte of the engine's answer."""
    message = exc.client_message(arm)
    return json_error(exc.status, exc.error_type, message, request_id, arm)


def bad_request(request_id: str, message: str, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_body(message, status=400, error_type="BadRequestError", param=param),
        status=400,
        content_type="application/json",
        headers={REQUEST_ID_HEADER: request_id},
    )


def too_large(request_id: str, limit: int) -> web.Response:
    message = f"request body is larger than the proxy's limit of {limit} bytes"
    return json_error(413, "RequestTooLarge", message, request_id)


def too_deep(request_id: str) -> web.Response:
    message = f"request body nests JSON deeper than the proxy's limit of {MAX_JSON_DEPTH} levels"
    return bad_request(request_id, message)


def headers_too_large(request_id: str, message: str) -> web.Response:
    return json_error(431, "RequestHeaderFieldsTooLarge", message, request_id)


def method_not_allowed(request_id: str, method: str) -> web.Response:
    message = f"method {method} is not served on /v1/* (allowed: {ALLOW_HEADER})"
    response = json_error(405, "MethodNotAllowed", message, request_id)
    response.headers["Allow"] = ALLOW_HEADER
    return response
