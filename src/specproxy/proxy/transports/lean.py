"""The lean transport: a minimal HTTP/1.1 client for plain-http engines.

Why it exists: for a small non-streaming request, aiohttp's `ClientSession` request path (request
object, payload registry, connector bookkeeping, response parser, stream reader) was about a
quarter of the proxy's CPU time (py-spy, see benchmarks/bench_proxy.py). The proxy needs much
less: send one request with the client's headers on a pooled keep-alive connection, and read
back status, headers and a body framed by Content-Length, chunked encoding or connection close.
That is all this module does. HEAD (a body-less answer with a length) is not for it: the
pass-through keeps aiohttp's transport (see `select`).

Semantics kept from the aiohttp session it replaces on that path:
- keep-alive pool without a cap; a connection goes back to the pool only after a complete
  response that allows reuse (no `Connection: close`, HTTP/1.1 or explicit keep-alive);
- connect timeout -> `UpstreamTimeout` (504), refused/unreachable -> `UpstreamConnectError`
  (502), read timeout = the longest silence while a response is awaited -> `UpstreamTimeout`,
  deadline = the longest time from sending to the end of the body (a slow drip never falls
  silent) -> `UpstreamTimeout`; the three are set per call (`request`);
- an upstream that closes, or sends garbage or a truncated response, after the request was
  written raises `UpstreamBroken`. Nothing is retried once a request byte was written, because
  the upstream may have started generating (a POST is not idempotent). Connections the upstream
  closed while idle are dropped as soon as the loop sees the close, and connections idle longer
  than `idle_timeout_s` (below uvicorn's 5 s keep-alive) are not reused, which makes the race of
  writing into a connection the server is just closing rare.

Backpressure: a connection stops reading its socket once `READ_HIGH_WATER` bytes wait in its
buffer, and reads again when the reader took it below `READ_LOW_WATER` (asyncio's flow control,
as aiohttp's own reader does): a relay that waits on a slow client holds one buffer per stream,
and the engine's socket fills instead.

It raises the errors of `specproxy.errors` itself: there is nothing to map at its boundary.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterable
from typing import Any, Final, cast

from multidict import CIMultiDict
from yarl import URL

from specproxy.errors import (
    UpstreamBroken,
    UpstreamConnectError,
    UpstreamConnectTimeout,
    UpstreamTimeout,
)
from specproxy.proxy.headers import RESPONSE_DROP, OutboundHeaders
from specproxy.proxy.transports.wire import split_head, take_chunked

__all__ = ["READ_HIGH_WATER", "READ_LOW_WATER", "LeanTransport", "UpstreamPool", "UpstreamResponse"]

READ_HIGH_WATER: Final = 256 * 1024  # buffered bytes at which a connection pauses reading
READ_LOW_WATER: Final = 64 * 1024  # and below which it resumes

_MAX_HEAD: Final = 64 * 1024  # status line + headers


class _Connection(asyncio.Protocol):
    """One upstream socket: buffers what arrives and wakes the single reader waiting on it."""

    __slots__ = (
        "buf",
        "closed",
        "deadline",
        "expiry",
        "idle_since",
        "paused",
        "pool",
        "read_limit",
        "timer",
        "transport",
        "waiter",
    )

    def __init__(self, pool: UpstreamPool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.waiter: asyncio.Future[None] | None = None
        self.closed = False
        self.paused = False  # reading paused: `buf` reached READ_HIGH_WATER
        self.idle_since = 0.0
        self.deadline: float | None = None  # loop time by which the current response must end
        self.read_limit: float | None = None  # longest silence within the current response
        self.expiry = 0.0  # loop time at which the current wait times out
        self.timer: asyncio.TimerHandle | None = None  # at or before `expiry`; re-armed lazily

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, hence no isinstance check.
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if len(buf) >= READ_HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()
        self._wake()

    def consumed(self) -> None:
        """The reader took bytes from `buf`: read the socket again once it is low enough."""
        if self.paused and len(self.buf) < READ_LOW_WATER and not self.closed:
            self.paused = False
            assert self.transport is not None
            self.transport.resume_reading()

    def eof_received(self) -> bool:
        self.closed = True
        self._wake()
        return False  # let the transport close itself

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool._forget(self)
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def wait(self, limit_s: float | None) -> None:
        """Until more bytes arrive or the connection closes; `UpstreamTimeout` after `limit_s`
        of silence or at the response's deadline, whichever comes first.

        One timer serves many waits: a stream waits once per event, and a timer per wait
        (create, cancel) cost more than the rest of the wait. The timer fires at or before the
        current wait's expiry; if that wait has time left, it re-arms itself for it."""
        loop = self.pool.loop
        waiter = self.waiter = loop.create_future()
        deadline = self.deadline
        if limit_s is not None or deadline is not None:
            expiry = loop.time() + limit_s if limit_s is not None else deadline
            if deadline is not None and expiry is not None and deadline < expiry:
                expiry = deadline
            assert expiry is not None
            self.expiry = expiry
            timer = self.timer
            if timer is None or timer.when() > expiry:
                if timer is not None:
                    timer.cancel()
                self.timer = loop.call_at(expiry, self._on_timer)
        try:
            await waiter
        finally:
            self.waiter = None

    def _on_timer(self) -> None:
        self.timer = None
        waiter = self.waiter
        if waiter is None or waiter.done():
            return  # no wait in progress: the next one arms a timer again
        loop = self.pool.loop
        if loop.time() >= self.expiry:
            waiter.set_exception(UpstreamTimeout("upstream read timed out"))
        else:
            self.timer = loop.call_at(self.expiry, self._on_timer)

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if self.transport is not None:
            self.transport.close()


class UpstreamResponse:
    """Status, headers and body of one upstream response; release or close it when done."""

    __slots__ = (
        "_chunk_left",
        "_conn",
        "_done",
        "_headers",
        "_left",
        "_mode",
        "_pairs",
        "_reusable",
        "content_length",
        "content_type",
        "forwarded",
        "reason",
        "status",
    )

    def __init__(
        self,
        conn: _Connection,
        status: int,
        reason: str,
        pairs: list[tuple[str, str]],
        forwarded: list[tuple[str, str]],
        content_type: str,
        mode: str,
        length: int,
        reusable: bool,
    ) -> None:
        self._conn = conn
        self.status = status
        self.reason = reason
        self._pairs = pairs
        self._headers: CIMultiDict[str] | None = None
        self.forwarded = forwarded  # the headers that cross to the client (RESPONSE_DROP out)
        self.content_type = content_type
        self.content_length = length if mode == "length" else None
        self._mode = mode  # "length" | "chunked" | "close"
        self._left = length  # body bytes still to come ("length")
        self._chunk_left = -1  # bytes left in the current chunk, -1 before a size line
        self._done = mode == "length" and length == 0
        self._reusable = reusable

    @property
    def headers(self) -> CIMultiDict[str]:
        """Every header, as the upstream sent them (made on first use: the relay needs only
        `forwarded` and `content_type`)."""
        if self._headers is None:
            self._headers = CIMultiDict(self._pairs)
        return self._headers

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self.readany():
            parts.append(chunk)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def readany(self) -> bytes:
        """The next piece of the body as it arrives; b"" at its end."""
        conn = self._conn
        while not self._done:
            piece = self.read_nowait()
            if piece:
                return piece
            if self._ended(conn):
                break
            await conn.wait(conn.read_limit)
        return b""

    def read_nowait(self) -> bytes:
        """Decoded body bytes already buffered (possibly none); resumes a paused socket."""
        if self._done:
            return b""
        conn = self._conn
        piece = self._take(conn.buf)
        if conn.paused:
            conn.consumed()
        return piece

    def at_eof(self) -> bool:
        return self._done

    def _ended(self, conn: _Connection) -> bool:
        """Whether the body is complete now that no bytes are buffered; raises if it was cut."""
        if self._done:
            return True
        if not conn.closed:
            return False
        if self._mode == "close":
            self._done = True
            return True
        raise UpstreamBroken("the upstream closed the connection mid-body")

    def _take(self, buf: bytearray) -> bytes:
        """Consume decoded body bytes available in `buf` (possibly none)."""
        mode = self._mode
        if mode == "length":
            n = min(self._left, len(buf))
            if not n:
                return b""
            piece = bytes(buf[:n]) if n < len(buf) else bytes(buf)
            del buf[:n]
            self._left -= n
            self._done = self._left == 0
            return piece
        if mode == "close":
            piece = bytes(buf)
            buf.clear()
            return piece
        return self._take_chunked(buf)

    def _take_chunked(self, buf: bytearray) -> bytes:
        """Chunked framing, decoded and consumed in one call (`wire.take_chunked`)."""
        try:
            piece, self._chunk_left, done = take_chunked(buf, self._chunk_left)
        except ValueError as exc:
            raise UpstreamBroken(str(exc)) from None
        if done:
            self._done = True
        return piece

    def release(self) -> None:
        """Done with a completely read response: pool the connection if it may be reused."""
        conn = self._conn
        if self._done and self._reusable and not conn.closed and not conn.buf:
            conn.pool._put(conn)
        else:
            conn.close()

    def close(self) -> None:
        """Drop the connection (an incomplete body, an error, a client that went away)."""
        self._conn.close()


class UpstreamPool:
    """Keep-alive connections to one upstream `host:port`, without a cap."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        connect_timeout: float | None,
        read_timeout: float | None,
        idle_timeout_s: float = 4.0,
    ) -> None:
        self.host = host
        self.port = port
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.idle_timeout_s = idle_timeout_s
        self.loop = asyncio.get_running_loop()
        self._host_header = f"{host}:{port}" if port != 80 else host
        self._idle: dict[_Connection, None] = {}  # insertion-ordered: popitem() takes the newest
        self._closed = False

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    async def post(
        self,
        path: str,
        body: bytes,
        headers: bytes | Iterable[tuple[str, str]],
        *,
        connect_s: float | None = None,
        deadline_s: float | None = None,
    ) -> UpstreamResponse:
        """`request("POST", ...)`; `headers` may also be name/value pairs."""
        if not isinstance(headers, bytes):
            headers = "".join([f"{k}: {v}\r\n" for k, v in headers]).encode("latin-1")
        return await self.request(
            "POST",
            path,
            body,
            headers,
            connect_s=connect_s,
            read_s=self.read_timeout,
            deadline_s=deadline_s,
        )

    async def request(
        self,
        method: str,
        target: str,
        body: bytes | None,
        headers: bytes,
        *,
        connect_s: float | None = None,
        read_s: float | None,
        deadline_s: float | None = None,
    ) -> UpstreamResponse:
        """Send `method target` with `headers` and return once the response's status line and
        headers arrived. `headers` are ready `name: value\\r\\n` lines, without Host and
        Content-Length (set here) or hop-by-hop headers (the caller's business).
        `connect_s` overrides the pool's connect timeout; `read_s` bounds each silence while
        the response is awaited (None: no bound); `deadline_s` bounds the whole call, from here
        to the end of the body."""
        body = body or b""
        request = b"".join(
            (
                f"{method} {target} HTTP/1.1\r\nHost: {self._host_header}\r\n".encode("latin-1"),
                headers,
                b"Content-Length: %d\r\n\r\n" % len(body),
                body,
            )
        )
        deadline = None if deadline_s is None else self.loop.time() + deadline_s
        conn = self._idle_connection() or await self._connect(connect_s)
        conn.deadline = deadline
        conn.read_limit = read_s
        try:
            assert conn.transport is not None
            conn.transport.write(request)
            return await self._read_head(conn)
        except BaseException:
            conn.close()
            raise

    async def close(self) -> None:
        """Close idle connections; responses still being read close theirs when released."""
        self._closed = True
        idle, self._idle = self._idle, {}
        for conn in idle:
            conn.close()

    # ----------------------------------------------------------------------- pool

    def _idle_connection(self) -> _Connection | None:
        """A pooled connection still fit for a request, if any (a plain call, not a coroutine:
        the usual case on every request; `_connect` otherwise)."""
        if self._idle:
            expired = self.loop.time() - self.idle_timeout_s
            while self._idle:
                conn, _ = self._idle.popitem()
                transport = conn.transport
                if conn.closed or transport is None or transport.is_closing():
                    continue
                if conn.buf:  # bytes nobody asked for (e.g. a 408 before a close): unusable
                    conn.close()
                    continue
                if conn.idle_since < expired:
                    conn.close()
                    continue
                return conn
        return None

    async def _connect(self, connect_s: float | None = None) -> _Connection:
        try:
            _, conn = await asyncio.wait_for(
                self.loop.create_connection(lambda: _Connection(self), self.host, self.port),
                self.connect_timeout if connect_s is None else connect_s,
            )
        except TimeoutError:
            msg = f"connecting to {self.host}:{self.port} timed out"
            raise UpstreamConnectTimeout(msg) from None
        except OSError as exc:
            raise UpstreamConnectError(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        return conn

    def _put(self, conn: _Connection) -> None:
        if self._closed:
            conn.close()
            return
        conn.idle_since = self.loop.time()
        self._idle[conn] = None

    def _forget(self, conn: _Connection) -> None:
        self._idle.pop(conn, None)

    # ----------------------------------------------------------------------- parsing

    async def _read_head(self, conn: _Connection) -> UpstreamResponse:
        buf = conn.buf
        while True:
            end = buf.find(b"\r\n\r\n")
            if end >= 0:
                raw = bytes(buf[:end])
                del buf[: end + 4]
                response = _parse_head(conn, raw)
                if response is not None:
                    return response
                continue  # an interim 1xx response: the real one follows
            if len(buf) > _MAX_HEAD:
                raise UpstreamBroken("response headers too large")
            if conn.closed:
                if buf:
                    raise UpstreamBroken("the upstream closed the connection inside the headers")
                raise UpstreamBroken("the upstream closed the connection without a response")
            await conn.wait(conn.read_limit)


def _parse_head(conn: _Connection, raw: bytes) -> UpstreamResponse | None:
    """Parse a status line and headers; None for an interim (1xx) response."""
    try:
        head = split_head(raw, RESPONSE_DROP)
    except ValueError as exc:
        raise UpstreamBroken(str(exc)) from None
    if head is None:
        return None
    status, reason, http10, pairs, forward, content_type, connection, encoding, lengths = head
    connection = connection.lower() if connection else ""
    reusable = "keep-alive" in connection if http10 else "close" not in connection
    mode, length = "length", 0
    if status in (204, 304):
        pass
    elif encoding is not None:
        if encoding.rsplit(",", 1)[-1].strip().lower() == "chunked":
            mode = "chunked"
        else:
            mode, reusable = "close", False
    elif lengths:
        first = lengths[0]
        if not (first.isascii() and first.isdigit()) or (
            len(lengths) > 1 and any(v != first for v in lengths)
        ):
            raise UpstreamBroken(f"bad Content-Length {lengths!r}")
        length = int(first)
    else:
        mode, reusable = "close", False
    return UpstreamResponse(
        conn, status, reason, pairs, forward, content_type or "", mode, length, reusable
    )


class LeanTransport:
    """`UpstreamTransport` over an `UpstreamPool`, for one plain-http engine base URL, with the
    timeouts of one kind of call; `with_timeouts` makes a sibling on the same connection pool."""

    __slots__ = ("_connect_s", "_deadline_s", "_pool", "_prefix", "_read_s")

    def __init__(
        self,
        base_url: str,
        *,
        connect_s: float,
        read_s: float | None,
        deadline_s: float | None,
        pool: UpstreamPool | None = None,
    ) -> None:
        url = URL(base_url)
        if not self.usable(base_url) or url.host is None:
            raise ValueError(f"the lean transport needs a plain http:// base URL, not {base_url}")
        self._pool = pool or UpstreamPool(
            url.host, url.port or 80, connect_timeout=connect_s, read_timeout=read_s
        )
        self._prefix = url.raw_path.rstrip("/")
        self._connect_s = connect_s
        self._read_s = read_s
        self._deadline_s = deadline_s

    @staticmethod
    def usable(base_url: str) -> bool:
        """Whether this transport can reach `base_url` (http, a host, no query string)."""
        url = URL(base_url)
        return url.scheme == "http" and url.host is not None and not url.query_string

    def with_timeouts(
        self, *, connect_s: float, read_s: float | None, deadline_s: float | None
    ) -> LeanTransport:
        """The same engine and connections, other timeouts."""
        sibling = LeanTransport.__new__(LeanTransport)
        sibling._pool = self._pool
        sibling._prefix = self._prefix
        sibling._connect_s = connect_s
        sibling._read_s = read_s
        sibling._deadline_s = deadline_s
        return sibling

    @property
    def pool(self) -> UpstreamPool:
        return self._pool

    def send(
        self, method: str, target: str, body: bytes | None, headers: OutboundHeaders
    ) -> Coroutine[Any, Any, UpstreamResponse]:
        # The pool's coroutine itself, not one wrapping it: a frame less on every call.
        return self._pool.request(
            method,
            self._prefix + target,
            body,
            headers.lines(),
            connect_s=self._connect_s,
            read_s=self._read_s,
            deadline_s=self._deadline_s,
        )

    async def close(self) -> None:
        await self._pool.close()
