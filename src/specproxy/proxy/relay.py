"""Relaying an upstream answer to the client, timed on the side, and the proxy's own answers.

Upstream bytes reach the client as they arrive and unmodified (the one exception: the usage
event the proxy itself asked for is removed, see `sse`). A stream that breaks mid-way is cut off
the same way for the client (no synthetic end). "Last byte written" is a real timestamp: the
response is finished here, not by aiohttp after the handler returns.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any, Final, Protocol

from aiohttp import ClientConnectorError, ClientError, web

from specproxy.errors import error_body
from specproxy.proxy.headers import (
    ARM_HEADER,
    REQUEST_ID_HEADER,
    is_event_stream,
    response_headers,
)
from specproxy.proxy.limits import ALLOW_HEADER, MAX_JSON_DEPTH
from specproxy.proxy.sse import SSEScanner
from specproxy.proxy.trace import STATUS_CLIENT_GONE, Trace
from specproxy.proxy.upstream import UpstreamError
from specproxy.proxy.usage import usage_of
from specproxy.records import Arm

__all__ = [
    "UPSTREAM_ERRORS",
    "Failure",
    "Reply",
    "bad_request",
    "classify",
    "cut_off",
    "headers_too_large",
    "json_error",
    "method_not_allowed",
    "relay",
    "send_error",
    "too_deep",
    "too_large",
    "write_eof",
]

_BUFFER_LIMIT: Final = 8 * 1024 * 1024  # non-stream bodies up to this size are sent in one write

# Failures of an upstream call, from either client.
UPSTREAM_ERRORS: Final = (ClientError, UpstreamError, TimeoutError)


class _Body(Protocol):
    async def readany(self) -> bytes: ...


class Reply(Protocol):
    """What the request path reads from an upstream response: aiohttp's or the lean client's."""

    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content_length(self) -> int | None: ...
    @property
    def content(self) -> _Body: ...
    async def read(self) -> bytes: ...
    def release(self) -> Any: ...
    def close(self) -> None: ...


class Failure(Exception):
    """An upstream failure before any byte reached the client."""

    def __init__(self, kind: str, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.error_type = error_type


def classify(exc: BaseException, arm: Arm) -> Failure:
    if isinstance(exc, TimeoutError):
        return Failure("timeout", 504, "GatewayTimeout", f"the {arm.value} arm timed out")
    if isinstance(exc, UpstreamError) and exc.kind != "connect":
        return Failure(
            exc.kind, 502, "BadGateway", f"the {arm.value} arm sent a broken response: {exc}"
        )
    if isinstance(exc, ClientError) and not isinstance(exc, ClientConnectorError):
        # aiohttp after connecting (reset, closed before or inside the headers): the request
        # went out, so this is a broken answer, as the lean client says for the same fault.
        return Failure(
            "broken", 502, "BadGateway", f"the {arm.value} arm sent a broken response: {exc}"
        )
    return Failure("connect", 502, "BadGateway", f"the {arm.value} arm could not be reached: {exc}")


async def relay(
    request: web.Request, trace: Trace, upstream: Reply, strip_usage: bool
) -> web.StreamResponse:
    """Send the upstream's answer to the client: streamed, or buffered when small and framed."""
    if is_event_stream(upstream.headers):
        return await _stream(request, trace, upstream, strip_usage)
    return await _buffered(request, trace, upstream)


async def _stream(
    request: web.Request, trace: Trace, upstream: Reply, strip_usage: bool
) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=upstream.status,
        reason=upstream.reason,
        headers=response_headers(upstream.headers, trace.arm, trace.request_id),
    )
    scanner = trace.scanner = SSEScanner(strip_usage=strip_usage)
    perf_counter = time.perf_counter
    content = upstream.content
    try:
        await resp.prepare(request)
    except ConnectionError:
        trace.disconnected = True
        trace.fail("disconnected", STATUS_CLIENT_GONE)
        return resp
    while True:
        try:
            chunk = await content.readany()
        except UPSTREAM_ERRORS as exc:
            trace.upstream_end = perf_counter()
            trace.fail("timeout" if isinstance(exc, TimeoutError) else "broken")
            await _flush(resp, scanner.finish())
            cut_off(request)
            trace.e2e_end = perf_counter()
            return resp
        now = perf_counter()
        if not chunk:
            break
        trace.upstream_end = now
        out = scanner.feed(chunk, now)
        if out and not await _flush(resp, out):
            trace.disconnected = True
            trace.fail("disconnected")
            trace.e2e_end = perf_counter()
            return resp
    tail = scanner.finish()
    if upstream.status == 200 and is_event_stream(upstream.headers):
        defect = scanner.defect()  # relayed as it came, but never a usable sample
        if defect is not None:
            trace.fail(defect)
    if (tail and not await _flush(resp, tail)) or not await write_eof(resp):
        trace.disconnected = True
        trace.fail("disconnected")
    trace.e2e_end = perf_counter()
    return resp


async def _buffered(request: web.Request, trace: Trace, upstream: Reply) -> web.StreamResponse:
    length = upstream.content_length
    if length is None or length > _BUFFER_LIMIT:
        return await _stream(request, trace, upstream, strip_usage=False)
    try:
        payload = await upstream.read()
    except UPSTREAM_ERRORS as exc:
        failure = classify(exc, trace.arm)
        kind = "timeout" if failure.kind == "timeout" else "broken"
        trace.fail(kind)
        trace.status = failure.status  # what the client gets: nothing was sent yet
        return await send_error(request, trace, failure)
    trace.upstream_end = time.perf_counter()
    if upstream.status == 200:
        trace.non_stream_usage, trace.speculative = usage_of(payload)
    resp = web.Response(
        body=payload,
        status=upstream.status,
        reason=upstream.reason,
        headers=response_headers(upstream.headers, trace.arm, trace.request_id),
    )
    try:  # `write_eof` inlined: one coroutine frame less on the hot path
        await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        trace.disconnected = True
        trace.fail("disconnected")
    trace.e2e_end = time.perf_counter()
    return resp


async def send_error(request: web.Request, trace: Trace, failure: Failure) -> web.StreamResponse:
    """Answer an upstream failure that happened before any byte reached the client."""
    resp = json_error(failure.status, failure.error_type, str(failure), trace.request_id, trace.arm)
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


async def write_eof(resp: web.StreamResponse, request: web.Request | None = None) -> bool:
    """Finish a response ourselves, so that 'last byte written' is a real timestamp."""
    try:
        if request is not None:
            await resp.prepare(request)
        await resp.write_eof()
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
        headers[ARM_HEADER] = arm.value
    return web.Response(
        body=error_body(message, status=status, error_type=error_type),
        status=status,
        content_type="application/json",
        headers=headers,
    )


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
