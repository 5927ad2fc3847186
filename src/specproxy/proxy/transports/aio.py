"""The aiohttp transport: an engine reached through the arm's `ClientSession` (https, any URL).

aiohttp's exceptions are mapped to the tree of `specproxy.errors` here, once (httpx's
`map_httpcore_exceptions`): a timeout of any phase -> `UpstreamTimeout`; no connection
(`ClientConnectorError`: refused, unreachable, DNS; nothing was sent) -> `UpstreamConnectError`;
any other client error (disconnected before or during the answer, bad framing) ->
`UpstreamBroken`, as the lean transport says for the same events.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from aiohttp import (
    ClientConnectorError,
    ClientError,
    ClientResponse,
    ClientSession,
    ClientTimeout,
    ConnectionTimeoutError,
)
from yarl import URL

from specproxy.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamError,
    UpstreamTimeout,
)
from specproxy.proxy.headers import OutboundHeaders, forwarded

__all__ = ["AiohttpReply", "AiohttpTransport", "upstream_error"]

_URL_CACHE: Final = 64  # targets whose URL is kept (the measured paths; not every query string)


def upstream_error(exc: BaseException) -> UpstreamError:
    """The `UpstreamError` an exception of aiohttp's client (or a timeout) stands for."""
    if isinstance(exc, UpstreamError):
        return exc
    if isinstance(exc, ConnectionTimeoutError):  # nothing was sent
        return UpstreamConnectTimeout(str(exc))
    if isinstance(exc, TimeoutError):  # ServerTimeoutError, SocketTimeoutError, ...
        return UpstreamTimeout(str(exc))
    if isinstance(exc, (ClientConnectorError, ConnectionRefusedError)):
        return UpstreamConnectError(str(exc))
    return UpstreamBroken(str(exc) or type(exc).__name__)


class AiohttpReply:
    """A `Reply` over aiohttp's `ClientResponse`, its exceptions mapped."""

    __slots__ = (
        "_content",
        "_resp",
        "content_length",
        "content_type",
        "forwarded",
        "headers",
        "reason",
        "status",
    )

    def __init__(self, resp: ClientResponse) -> None:
        self._resp = resp
        self._content = resp.content
        self.status: int = resp.status
        self.reason: str | None = resp.reason
        self.headers: Mapping[str, str] = resp.headers
        self.content_type: str = resp.headers.get("Content-Type", "")
        self.forwarded: Sequence[tuple[str, str]] = forwarded(resp.headers)
        self.content_length: int | None = resp.content_length

    async def readany(self) -> bytes:
        try:
            return await self._content.readany()
        except (ClientError, TimeoutError) as exc:
            raise upstream_error(exc) from exc

    def read_nowait(self) -> bytes:
        try:
            return self._content.read_nowait()
        except (ClientError, TimeoutError) as exc:
            raise upstream_error(exc) from exc

    def at_eof(self) -> bool:
        return self._content.at_eof()

    async def read(self) -> bytes:
        try:
            return await self._resp.read()
        except (ClientError, TimeoutError) as exc:
            raise upstream_error(exc) from exc

    def release(self) -> None:
        self._resp.release()

    def close(self) -> None:
        self._resp.close()


class AiohttpTransport:
    """`UpstreamTransport` over a `ClientSession` owned by the app (closed with it, not here),
    with the timeouts of one kind of call."""

    __slots__ = ("_base", "_session", "_timeout", "_urls")

    def __init__(self, base_url: str, session: ClientSession, timeout: ClientTimeout) -> None:
        self._base = base_url.rstrip("/")
        self._session = session
        self._timeout = timeout
        self._urls: dict[str, URL] = {}

    async def send(
        self, method: str, target: str, body: bytes | None, headers: OutboundHeaders
    ) -> AiohttpReply:
        url = self._urls.get(target)
        if url is None:
            url = URL(self._base + target, encoded=True)
            if len(self._urls) < _URL_CACHE:
                self._urls[target] = url
        try:
            resp = await self._session.request(
                method,
                url,
                data=body,
                headers=headers.multidict(),
                allow_redirects=False,
                timeout=self._timeout,
            )
        except (ClientError, TimeoutError) as exc:
            raise upstream_error(exc) from exc
        return AiohttpReply(resp)

    async def close(self) -> None:
        """Nothing to do: the session belongs to the app."""
