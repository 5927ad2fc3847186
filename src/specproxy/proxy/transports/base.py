"""The seam between the request path and the HTTP clients that reach an engine.

An `UpstreamTransport` sends one request to one engine base URL and returns a `Reply` once the
status line and headers arrived; the body is then read with `readany()` (as it arrives) or
`read()` (whole). Both raise only `specproxy.errors.UpstreamError`s: a transport maps its
client's own exceptions at its boundary, so the request path above it handles one tree.

Implementations: `lean.LeanTransport` (plain http, the proxy's own HTTP/1.1 client),
`aio.AiohttpTransport` (aiohttp's `ClientSession`: https, anything), `mock.MockTransport`
(tests). `select` chooses them, once per engine endpoint and `Mode`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from specproxy.proxy.headers import OutboundHeaders

__all__ = ["Reply", "UpstreamTransport"]


class Reply(Protocol):
    """An engine's response whose status line and headers arrived."""

    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content_type(self) -> str:
        """The Content-Type header; "" without one."""
        ...

    @property
    def forwarded(self) -> Sequence[tuple[str, str]]:
        """The headers that reach the client (`headers.forwarded`), in the upstream's order."""
        ...

    @property
    def content_length(self) -> int | None: ...
    async def readany(self) -> bytes:
        """The next piece of the body as it arrives; b"" at its end."""
        ...

    async def read(self) -> bytes:
        """The whole (rest of the) body."""
        ...

    def read_nowait(self) -> bytes:
        """The body bytes already received, without waiting: b"" when none are (yet)."""
        ...

    def at_eof(self) -> bool:
        """Whether the body ended with the piece `readany` last returned: no byte and no error
        can follow it (False where the transport cannot tell yet: `readany` then says so with
        b"")."""
        ...

    def release(self) -> None:
        """Done with a completely read body: the connection may be reused."""
        ...

    def close(self) -> None:
        """Drop the connection (incomplete body, error, client gone)."""
        ...


class UpstreamTransport(Protocol):
    """Sends requests to one engine base URL (`target` is the path and query below it)."""

    async def send(
        self, method: str, target: str, body: bytes | None, headers: OutboundHeaders
    ) -> Reply: ...

    async def close(self) -> None: ...
