"""The store fails under the proxy: an outage (another process holds the database) and a full
disk. Clients never notice; records buffer, spill to the spill file elsewhere, and are replayed
exactly once when the store is back: none lost, none twice."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from specproxy.errors import StoreError
from specproxy.store.sqlite import SqliteStore
from tests.faults.conftest import MakeRig, Rig, fault_row, rss_bytes
from tests.proxy.conftest import CHAT, chat

pytestmark = pytest.mark.timeout(120)

REQUESTS = 300
STORE = {"max_buffer": 50, "batch_size": 25, "flush_interval_s": 0.1}


async def _load(rig: Rig) -> None:
    for i in range(REQUESTS):
        stream = i % 2 == 0
        async with rig.client.post(CHAT, json=chat(stream=stream), headers={"x-fault": "ok"}) as r:
            assert r.status == 200  # the store's trouble is never the client's
            await r.read()
        rig.sent += 1


async def _replayed(rig: Rig) -> None:
    # Past max_buffer rows in memory (plus a failed batch put back and one being written), the
    # rest went to disk.
    assert rig.store.spilled >= REQUESTS - STORE["max_buffer"] - 2 * STORE["batch_size"]
    await rig.store.flush()  # the store is back: buffers and spill files go in
    assert rig.store.pending == 0
    rows = await rig.check_records({None})
    assert list(rows["status"]) == [200] * REQUESTS


async def test_store_outage(make_rig: MakeRig, tmp_path: Path) -> None:
    rig = await make_rig(store={**STORE, "url": f"sqlite:///{tmp_path}/store.db?timeout=0.05"})
    await rig.rows()  # opened and migrated before the outage
    blocker = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
    blocker.execute("BEGIN EXCLUSIVE")  # another process holds the database: every write fails
    try:
        await _load(rig)
        with pytest.raises(StoreError):
            await rig.store.flush()
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    await _replayed(rig)
    fault_row("store outage", f"{REQUESTS} x 200", f"{REQUESTS} x ok, replayed from spill", 0,
              rig.rss_before, rss_bytes())  # fmt: skip


async def test_full_disk(make_rig: MakeRig, caplog: pytest.LogCaptureFixture) -> None:
    """The database cannot grow: SQLite's own SQLITE_FULL ("database or disk is full"), the
    error a full filesystem gives, raised here by capping the writer connection's page count at
    the file's current size (a mount of a tiny filesystem needs privileges CI may not have)."""
    caplog.set_level(logging.WARNING)
    rig = await make_rig(store=STORE)
    await rig.rows()
    store = rig.store
    assert isinstance(store, SqliteStore)

    def cap(pages: int | None) -> None:
        conn = store._conn  # the writer thread's connection (the only one that writes)
        assert conn is not None
        if pages is None:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages}")

    await store._on_writer(cap, None)
    try:
        await _load(rig)
        with pytest.raises(StoreError):
            await store.flush()
        assert "database or disk is full" in caplog.text  # what SQLite said
    finally:
        await store._on_writer(cap, 1 << 30)  # space again
    await _replayed(rig)
    fault_row("full disk (store)", f"{REQUESTS} x 200", f"{REQUESTS} x ok, replayed from spill",
              0, rig.rss_before, rss_bytes())  # fmt: skip
