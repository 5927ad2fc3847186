"""`MockTransport(handler)`: an engine without a network, for tests (httpx's `MockTransport`).

The handler gets each `MockRequest` and returns a `MockReply` (or an awaitable of one), or
raises an `UpstreamError` to stand for a failed connection or a timeout before the headers. A
`MockReply` hands out its body chunks one per `readany()` and can end in an error, e.g. an
`UpstreamBroken` for a stream cut short.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from multidict import CIMultiDict, CIMultiDictProxy

from specproxy.errors import UpstreamError
from specproxy.proxy.headers import OutboundHeaders, forwarded

__all__ = ["MockReply", "MockRequest", "MockTransport"]


@dataclass(frozen=True, slots=True)
class MockRequest:
    """What the transport was asked to send."""

    method: str
    target: str
    body: bytes | None
    headers: CIMultiDictProxy[str]


class MockReply:
    """A canned response: status, headers, body chunks, and optionally an error after them."""

    def __init__(
        self,
        status: int = 200,
        headers: Mapping[str, str] | None = None,
        chunks: Iterable[bytes] = (),
        *,
        error: UpstreamError | None = None,
        reason: str = "OK",
        content_length: int | None = None,
    ) -> None:
        self.status = status
        self.reason: str | None = reason
        self.headers: Mapping[str, str] = CIMultiDictProxy(CIMultiDict(headers or {}))
        self.content_type: str = self.headers.get("Content-Type", "")
        self.forwarded: Sequence[tuple[str, str]] = forwarded(self.headers)
        self._chunks = [c for c in chunks if c]
        self._error = error
        self.content_length = content_length
        self.released = False
        self.closed = False

    async def readany(self) -> bytes:
        if self._chunks:
            return self._chunks.pop(0)
        if self._error is not None:
            raise self._error
        return b""

    def read_nowait(self) -> bytes:
        return self._chunks.pop(0) if self._chunks else b""

    def at_eof(self) -> bool:
        return not self._chunks and self._error is None

    async def read(self) -> bytes:
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


Handler = Callable[[MockRequest], MockReply | Awaitable[MockReply]]


class MockTransport:
    """`UpstreamTransport` answering every request with `handler(request)`."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
        self.requests: list[MockRequest] = []
        self.closed = False

    async def send(
        self, method: str, target: str, body: bytes | None, headers: OutboundHeaders
    ) -> MockReply:
        request = MockRequest(method, target, body, CIMultiDictProxy(headers.multidict()))
        self.requests.append(request)
        result = self._handler(request)
        if inspect.isawaitable(result):
            return await result
        return result

    async def close(self) -> None:
        self.closed = True
