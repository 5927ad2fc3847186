"""Faulty clients: 500 of them leaving mid-stream at once."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from tests.faults.conftest import MakeRig, MiB, fault_row, rss_bytes
from tests.proxy.conftest import CHAT, chat

pytestmark = pytest.mark.timeout(300)

CLIENTS = 500


async def test_disconnect_storm_mid_stream(make_rig: MakeRig) -> None:
    """500 clients start a slow stream, read its first bytes, and all leave: every call gets one
    record (disconnected), every upstream connection is closed (vLLM would abort the work)."""
    rig = await make_rig(read_s=30.0)
    url = rig.server.make_url(CHAT)
    started = asyncio.Event()
    reading = 0

    async def client(session: aiohttp.ClientSession) -> None:
        nonlocal reading
        headers = {"x-fault": "endless_sse"}  # ends only when the client leaves
        async with session.post(url, json=chat(stream=True), headers=headers) as resp:
            assert resp.status == 200
            assert await resp.content.readany()  # mid-stream
            reading += 1
            if reading == CLIENTS:
                started.set()
            await started.wait()  # all leave together
            resp.close()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(CLIENTS)))
    rig.sent = CLIENTS
    for _ in range(600):  # each handler is cancelled and writes its record; wait for all
        if rig.upstream.aborted == CLIENTS and len((await rig.rows())["request_id"]) == CLIENTS:
            break
        await asyncio.sleep(0.1)
    rss_after = rss_bytes()
    rows = await rig.check_records({"disconnected"})
    assert all(rows["disconnected"])
    assert rig.upstream.aborted == CLIENTS  # every upstream stream was closed by the proxy
    assert rss_after - rig.rss_before < 128 * MiB
    fault_row(f"disconnect storm ({CLIENTS} mid-stream)", "-", f"{CLIENTS} x disconnected", 0,
              rig.rss_before, rss_after)  # fmt: skip
