"""The proxy's listening side: its socket, a site that accepts new connections in batches, and
the loop that serves an app on them until SIGTERM or SIGINT.

uvloop's server, which aiohttp's `SockSite` starts, accepts one connection per turn of the event
loop. Under load a turn takes milliseconds, so a burst of new connections (a load balancer
reconnecting, a benchmark opening 256) waits one turn per connection ahead of it in the queue:
the last of 256 waited over a second for its first byte to be read. `AcceptSite` takes up to
`ACCEPT_BATCH` connections off the queue each time the socket is readable, and hands each to the
loop with `connect_accepted_socket`.

`serve_app` is `web.run_app` with that site in place of `SockSite`: the same runner (signals,
graceful shutdown), the same loop teardown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable

from aiohttp import web

from specproxy.errors import ConfigError

__all__ = ["ACCEPT_BATCH", "LISTEN_BACKLOG", "AcceptSite", "listen_socket", "serve_app"]

log = logging.getLogger(__name__)

# Connections the kernel completes and queues while the event loop is busy (capped by
# net.core.somaxconn). aiohttp's default, 128, is below a burst of new connections that one
# busy core meets: the kernel then drops the handshakes past it, and each such client waits out
# a SYN retransmit, 1 s and more.
LISTEN_BACKLOG = 1024
# New connections taken off the queue per wakeup: the queue drains in a few turns of the loop,
# and a turn stays bounded (accepting is a system call and a task each).
ACCEPT_BATCH = 128
# `web.run_app`'s defaults, which serve had: an idle client connection is closed after
# KEEPALIVE_S (the handler's own default is an hour), and on SIGTERM requests in flight get
# SHUTDOWN_S to finish.
KEEPALIVE_S = 75.0
SHUTDOWN_S = 60.0
# After the process ran out of file descriptors (or the kernel of buffers), a pause before
# accepting again, in which the connections wait in the queue rather than spinning the loop.
_ACCEPT_PAUSE_S = 0.5


def listen_socket(host: str, port: int, *, reuse_port: bool = False) -> socket.socket:
    """A listening TCP socket on host:port; a port in use or a bad address is a `ConfigError`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server(
            (host, port), family=family, backlog=LISTEN_BACKLOG, reuse_port=reuse_port
        )
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)
        raise ConfigError(f"cannot listen on {host}:{port}: {reason}") from exc


class _Acceptor:
    """Accepts in batches on a listening socket; `close` stops it and closes the socket."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        factory: Callable[[], asyncio.Protocol],
        batch: int,
    ) -> None:
        self._loop = loop
        self._sock = sock
        self._factory = factory
        self._batch = batch
        self._opening: set[asyncio.Task[object]] = set()
        self._closed = False
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._accept)

    def _accept(self) -> None:
        for _ in range(self._batch):
            try:
                conn, _ = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return  # the queue is empty
            except ConnectionAbortedError:
                continue  # the client gave up while queued
            except OSError as exc:  # EMFILE, ENFILE, ENOBUFS, ENOMEM
                log.warning("accepting a connection failed, pausing: %s", exc)
                self._loop.remove_reader(self._sock.fileno())
                self._loop.call_later(_ACCEPT_PAUSE_S, self._resume)
                return
            conn.setblocking(False)
            task = self._loop.create_task(self._open(conn))
            self._opening.add(task)
            task.add_done_callback(self._opening.discard)

    async def _open(self, conn: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, conn)
        except OSError:  # the client left before its transport existed
            conn.close()

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(ValueError, OSError):  # a closed socket has no fileno
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()


class AcceptSite(web.BaseSite):
    """`web.SockSite`, but accepting up to `batch` connections per wakeup (module docstring)."""

    __slots__ = ("_acceptor", "_batch", "_name", "_sock")

    def __init__(
        self,
        runner: web.BaseRunner,
        sock: socket.socket,
        *,
        batch: int = ACCEPT_BATCH,
        shutdown_timeout: float = 60.0,
    ) -> None:
        super().__init__(runner, shutdown_timeout=shutdown_timeout, backlog=LISTEN_BACKLOG)
        self._sock = sock
        self._batch = batch
        self._acceptor: _Acceptor | None = None
        host, port = sock.getsockname()[:2]
        self._name = f"http://{host}:{port}"

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        await super().start()
        server = self._runner.server
        assert server is not None
        self._acceptor = _Acceptor(asyncio.get_running_loop(), self._sock, server, self._batch)

    async def stop(self) -> None:
        if self._acceptor is not None:
            self._acceptor.close()
        await super().stop()


def serve_app(
    app: web.Application,
    sock: socket.socket,
    *,
    loop: asyncio.AbstractEventLoop,
    unix_path: str | None = None,
) -> None:
    """Serve `app` on `sock` (and `unix_path`) until SIGTERM or SIGINT, then shut down gracefully
    and close `loop`: `web.run_app`'s sequence, with `AcceptSite` for the TCP socket."""

    async def main() -> None:
        runner = web.AppRunner(
            app,
            handle_signals=True,
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=KEEPALIVE_S,
            shutdown_timeout=SHUTDOWN_S,
        )
        await runner.setup()
        try:
            await AcceptSite(runner, sock).start()
            if unix_path is not None:
                await web.UnixSite(runner, unix_path).start()
            await asyncio.Event().wait()  # until a signal raises GracefulExit
        finally:
            await runner.cleanup()

    asyncio.set_event_loop(loop)
    task = loop.create_task(main())
    try:
        loop.run_until_complete(task)
    except (web.GracefulExit, KeyboardInterrupt):
        pass
    finally:
        try:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    loop.run_until_complete(task)
        finally:
            _cancel_all(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()
            asyncio.set_event_loop(None)


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is still running and wait for it (as `asyncio.run` and `run_app` do)."""
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler(
                {
                    "message": "unhandled exception during shutdown",
                    "exception": task.exception(),
                    "task": task,
                }
            )
