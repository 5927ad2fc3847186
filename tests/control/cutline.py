"""A TCP line between one replica and its store that the test can cut: the network partition of
one replica, while the others still reach the store.

It relays loopback connections to the store's port. `cut()` resets every open connection and,
until `mend()`, every new one at once (what a replica sees when its route to the database is
gone and the far side answers with resets), so a read fails within the store's own timeouts
instead of hanging on them.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import urlsplit, urlunsplit

__all__ = ["CutLine"]

_CHUNK = 65536


class CutLine:
    """Relays `127.0.0.1:<port>` to the store at `url`; `url` is the store's URL through it."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self._parts = parts
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.is_cut = False
        self.url = ""

    async def __aenter__(self) -> CutLine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        user = f"{self._parts.username}@" if self._parts.username else ""
        self.url = urlunsplit(self._parts._replace(netloc=f"{user}127.0.0.1:{port}"))
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.close()
        self.cut()
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    def cut(self) -> None:
        """Reset every open connection; refuse new ones (reset at once) until `mend`."""
        self.is_cut = True
        for writer in list(self._open):
            writer.transport.abort()
        self._open.clear()

    def mend(self) -> None:
        self.is_cut = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.is_cut:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self._open.update((writer, up_writer))
        pipes = [
            asyncio.create_task(self._pipe(reader, up_writer)),
            asyncio.create_task(self._pipe(up_reader, writer)),
        ]
        for task in pipes:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(_CHUNK):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._open.discard(writer)
            writer.transport.abort()
