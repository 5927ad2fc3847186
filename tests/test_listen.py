"""The listening side: batched accepts, the site serving through them, and closing."""

from __future__ import annotations

import asyncio
import errno
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from specproxy.errors import ConfigError
from specproxy.listen import AcceptSite, _Acceptor, listen_socket


class _Counted(asyncio.Protocol):
    made = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        type(self).made += 1
        transport.close()


def _queued(sock: socket.socket, n: int) -> list[socket.socket]:
    """`n` connections the kernel has completed and queued on `sock` (nothing accepted yet)."""
    return [socket.create_connection(sock.getsockname()[:2]) for _ in range(n)]


async def test_one_wakeup_accepts_a_batch_and_the_next_the_rest() -> None:
    loop = asyncio.get_running_loop()
    sock = listen_socket("127.0.0.1", 0)
    clients = _queued(sock, 40)
    _Counted.made = 0
    acceptor = _Acceptor(loop, sock, _Counted, batch=16)
    try:
        acceptor._accept()  # what one readable event runs
        assert len(acceptor._opening) == 16
        acceptor._accept()
        acceptor._accept()  # 8 left, then the queue is empty: no error, no wait
        for _ in range(1000):  # loop turns, not time: each opening takes a turn or two
            if _Counted.made == 40:
                break
            await asyncio.sleep(0)
        assert _Counted.made == 40
    finally:
        acceptor.close()
        for client in clients:
            client.close()
    assert sock.fileno() == -1  # closing the acceptor closes its socket


class _Exhausted:
    """A listening socket whose next accept fails as when the process is out of descriptors."""

    def __init__(self, real: socket.socket) -> None:
        self.real = real

    def fileno(self) -> int:
        return self.real.fileno()

    def setblocking(self, flag: bool) -> None:
        self.real.setblocking(flag)

    def accept(self) -> tuple[socket.socket, object]:
        raise OSError(errno.EMFILE, "Too many open files")

    def close(self) -> None:
        self.real.close()


async def test_running_out_of_descriptors_pauses_accepting_then_resumes() -> None:
    loop = asyncio.get_running_loop()
    sock = listen_socket("127.0.0.1", 0)
    acceptor = _Acceptor(loop, _Exhausted(sock), _Counted, batch=16)  # type: ignore[arg-type]
    try:
        acceptor._accept()
        assert not loop.remove_reader(sock.fileno())  # stopped watching: no busy loop
        acceptor._resume()  # what the pause's timer calls
        assert loop.remove_reader(sock.fileno())  # watching again
    finally:
        acceptor.close()


@pytest.fixture
async def site_url() -> AsyncIterator[str]:
    async def hello(request: web.Request) -> web.Response:
        return web.Response(text="hi")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = listen_socket("127.0.0.1", 0)
    site = AcceptSite(runner, sock, batch=8)
    await site.start()
    assert site.name.startswith("http://127.0.0.1:")
    try:
        yield site.name
    finally:
        await runner.cleanup()
    assert sock.fileno() == -1


async def test_the_site_serves_a_burst_larger_than_its_batch(site_url: str) -> None:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def get() -> str:
            async with session.get(site_url) as resp:
                return await resp.text()

        assert await asyncio.gather(*(get() for _ in range(100))) == ["hi"] * 100


def test_a_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1"):
            listen_socket("127.0.0.1", taken.getsockname()[1])
