"""A real `specproxy serve` stopped under load: SIGTERM drains, SIGKILL loses only its stated
in-memory buffer and the restart replays the spill file; no process is left behind either way.

SIGKILL's stated bound: records still in memory when the process dies are lost. The store keeps
at most `store.max_buffer` rows in memory before it spills (the spill file survives the kill), a
failed batch put back may add `store.batch_size` more, and one batch may be being written: at most
max_buffer + 2 x batch_size records per SIGKILL.
In an outage (a write has failed, or one has run `STALLED_WRITE_S` without ending), every
buffered and every new row goes to the spill file at once, whatever max_buffer is: a SIGKILL then
loses at most the batch being written (and the rows of a hung write's first STALLED_WRITE_S).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
from pathlib import Path

import aiohttp
import pytest

from specproxy.store.sqlite import EXIT_UNSAFE
from tests.faults.conftest import RUN, fault_row
from tests.faults.serve_proc import Serve, stored_rows
from tests.faults.upstream import FaultUpstream
from tests.proctree import descendants, wait_gone
from tests.proxy.conftest import CHAT, chat

pytestmark = pytest.mark.timeout(300)

STREAMS = 50
MAX_BUFFER = 20
BATCH = 10


def _toml(upstream: FaultUpstream, tmp_path: Path, store_url: str) -> str:
    return f"""
baseline_url = "{upstream.url}"
speculative_url = "{upstream.url}"
run_id = "{RUN}"
[store]
url = "{store_url}"
spill_path = "{tmp_path}/spill/spill.jsonl"
max_buffer = {MAX_BUFFER}
batch_size = {BATCH}
flush_interval_s = 0.1
"""


async def test_sigterm_under_load_drains_every_stream(
    faulty: FaultUpstream, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    serve = Serve(tmp_path, _toml(faulty, tmp_path, f"sqlite:///{db}"))
    await serve.ready()
    rss_before = serve.rss_bytes()
    all_started = asyncio.Event()
    started = 0

    async def client(session: aiohttp.ClientSession) -> bytes:
        nonlocal started
        headers = {"x-fault": "slow_sse"}
        async with session.post(serve.url + CHAT, json=chat(stream=True), headers=headers) as r:
            assert r.status == 200
            first = await r.content.readany()
            started += 1
            if started == STREAMS:
                all_started.set()
            return first + await r.read()

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [asyncio.create_task(client(session)) for _ in range(STREAMS)]
        await all_started.wait()
        rss_load = serve.rss_bytes()
        children = descendants(serve.pid)
        os.kill(serve.pid, signal.SIGTERM)  # every stream is mid-way
        bodies = await asyncio.gather(*tasks)
    assert all(body.endswith(b"data: [DONE]\n\n") for body in bodies)  # drained, not cut
    assert await serve.wait() == 0
    rows = stored_rows(db, RUN)
    assert len(rows) == STREAMS == len({r[0] for r in rows})
    assert {(kind, status) for _, kind, status in rows} == {(None, 200)}
    assert not wait_gone(children, timeout_s=30)
    fault_row(f"SIGTERM under load ({STREAMS} streams)", "all complete, [DONE]",
              f"{STREAMS} x ok", 0, rss_before, rss_load)  # fmt: skip


async def test_sigkill_during_a_store_outage_then_restart_replays_the_spill(
    faulty: FaultUpstream, tmp_path: Path
) -> None:
    db = tmp_path / "store.db"
    toml = _toml(faulty, tmp_path, f"sqlite:///{db}?timeout=0.05")
    first = Serve(tmp_path, toml)
    await first.ready()
    rss_before = first.rss_bytes()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # store outage: rows buffer, then spill
    sent = 200
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(sent):
                headers = {"x-fault": "ok"}
                async with session.post(first.url + CHAT, json=chat(), headers=headers) as r:
                    assert r.status == 200
                    await r.read()
        for _ in range(1200):  # until everything past the memory bound is on disk
            spilled = await first.metric("specproxy_store_spilled_total")
            if spilled >= sent - MAX_BUFFER - 2 * BATCH:
                break
            await asyncio.sleep(0.1)
        rss_after = first.rss_bytes()
        children = descendants(first.pid)
        os.kill(first.pid, signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    assert not wait_gone(children, timeout_s=30)  # the reader and tracker died with it

    second = Serve(tmp_path, toml)  # same spill path: it claims the dead process's file
    await second.ready()
    for _ in range(1200):
        if await second.metric("specproxy_store_pending") == 0 and stored_rows(db, RUN):
            break
        await asyncio.sleep(0.1)
    rows = stored_rows(db, RUN)
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids))  # replayed once
    lost = sent - len(ids)
    assert 0 <= lost <= MAX_BUFFER + 2 * BATCH  # the stated bound: what was still in memory
    assert {(kind, status) for _, kind, status in rows} == {(None, 200)}
    os.kill(second.pid, signal.SIGTERM)
    assert await second.wait() == 0
    fault_row("SIGKILL in store outage + restart", f"{sent} x 200",
              f"{len(ids)} replayed from spill", lost, rss_before, rss_after)  # fmt: skip


@pytest.mark.parametrize(
    ("lock_timeout_s", "sent"), [(0.05, 200), (600.0, 100)], ids=["writes_fail", "writes_hang"]
)
async def test_sigkill_in_an_outage_below_max_buffer_loses_at_most_a_batch(
    faulty: FaultUpstream, tmp_path: Path, lock_timeout_s: float, sent: int
) -> None:
    """With the default-sized memory buffer (far above what the outage sees), rows recorded in a
    store outage go to the spill file as soon as the first write fails (`writes_fail`: SQLite's
    lock timeout 0.05 s) or has run STALLED_WRITE_S without ending (`writes_hang`: the lock
    timeout 600 s, as a hung PostgreSQL waits its 30 s command timeout): a SIGKILL then loses at
    most the batch being written. Main kept them all in memory until a write failed, and lost
    every one."""
    db = tmp_path / "store.db"
    toml = _toml(faulty, tmp_path, f"sqlite:///{db}?timeout={lock_timeout_s}").replace(
        f"max_buffer = {MAX_BUFFER}", "max_buffer = 200000"
    )
    first = Serve(tmp_path, toml)
    await first.ready()
    rss_before = first.rss_bytes()
    blocker = sqlite3.connect(db, isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # store outage: every write waits for the lock
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(sent):
                headers = {"x-fault": "ok"}
                async with session.post(first.url + CHAT, json=chat(), headers=headers) as r:
                    assert r.status == 200
                    await r.read()
        for _ in range(1200):  # bounded generously (main spilled nothing below max_buffer)
            if await first.metric("specproxy_store_spilled_total") >= sent - BATCH:
                break
            await asyncio.sleep(0.1)
        rss_after = first.rss_bytes()
        os.kill(first.pid, signal.SIGKILL)
        assert await first.wait() == -signal.SIGKILL
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    second = Serve(tmp_path, toml)
    await second.ready()
    for _ in range(1200):
        if await second.metric("specproxy_store_pending") == 0 and stored_rows(db, RUN):
            break
        await asyncio.sleep(0.1)
    ids = [r[0] for r in stored_rows(db, RUN)]
    assert len(ids) == len(set(ids))
    lost = sent - len(ids)
    assert 0 <= lost <= BATCH  # the stated bound in an outage: the batch being written
    os.kill(second.pid, signal.SIGTERM)
    assert await second.wait() == 0
    how = "writes fail" if lock_timeout_s < 1 else "writes hang"
    fault_row(f"SIGKILL in store outage ({how}), max_buffer 200k", f"{sent} x 200",
              f"{len(ids)} replayed from spill", lost, rss_before, rss_after)  # fmt: skip


async def test_a_truncated_shm_is_no_sigbus_and_loses_no_row(
    faulty: FaultUpstream, tmp_path: Path
) -> None:
    """SQLite's `-shm` truncated under a running proxy (issue 29, defect 5: SIGBUS, exit 135, no
    log line, 44 answered rows lost). The store checks the file before each statement, stops
    touching the database, spills, logs at CRITICAL and exits 75 after the drain; the restart
    reopens the database and replays the spill: every answered request is stored once."""
    db = tmp_path / "store.db"
    toml = _toml(faulty, tmp_path, f"sqlite:///{db}")
    first = Serve(tmp_path, toml)
    await first.ready()
    rss_before = first.rss_bytes()
    before, after = 40, 60

    async def send(serve: Serve, n: int) -> None:
        async with aiohttp.ClientSession() as session:
            for _ in range(n):
                headers = {"x-fault": "ok"}
                async with session.post(serve.url + CHAT, json=chat(), headers=headers) as r:
                    assert r.status == 200
                    await r.read()

    await send(first, before)
    for _ in range(1200):
        if len(stored_rows(db, RUN)) == before:
            break
        await asyncio.sleep(0.1)
    assert len(stored_rows(db, RUN)) == before
    os.truncate(f"{db}-shm", 0)  # what a cleanup job or a disk tool might do
    await send(first, after)
    for _ in range(1200):
        if await first.metric("specproxy_store_spilled_total") >= after:
            break
        await asyncio.sleep(0.1)
    assert await first.metric("specproxy_store_spilled_total") >= after
    assert first.proc.poll() is None  # alive: no SIGBUS
    assert "shrank from" in first.log.read_text() and "CRITICAL" in first.log.read_text()
    rss_after = first.rss_bytes()
    os.kill(first.pid, signal.SIGTERM)
    assert await first.wait() == EXIT_UNSAFE  # drained to the spill, the map never touched
    second = Serve(tmp_path, toml)
    await second.ready()
    for _ in range(1200):
        if len(stored_rows(db, RUN)) >= before + after:
            break
        await asyncio.sleep(0.1)
    ids = [r[0] for r in stored_rows(db, RUN)]
    assert len(ids) == len(set(ids)) == before + after  # every answered request, once
    os.kill(second.pid, signal.SIGTERM)
    assert await second.wait() == 0
    fault_row("SQLite -shm truncated under load", f"{before + after} x 200",
              f"{after} spilled, replayed on restart", 0, rss_before, rss_after)  # fmt: skip
