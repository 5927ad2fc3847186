"""The store inside the proxy app: it is the recorder, its metrics are served, close flushes."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path

from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from specproxy.app import create_app
from specproxy.appkeys import RECORDER, STORE
from specproxy.config import Config, StoreConfig


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_app_records_into_the_store(aiohttp_client: AiohttpClient, tmp_path: Path) -> None:
    db = tmp_path / "app.db"
    url = _closed_url()  # no upstream: every request is a recorded 502
    cfg = Config(
        baseline_url=url,
        speculative_url=url,
        run_id="app-run",
        store=StoreConfig(url=f"sqlite:///{db}", spill_path=str(tmp_path / "spill.jsonl")),
    )
    app = create_app(cfg, registry=CollectorRegistry())
    client = await aiohttp_client(app)
    store = app[STORE]
    assert app[RECORDER] is store
    for _ in range(3):
        async with client.post("/v1/completions", json={"model": "m", "prompt": "x"}) as resp:
            assert resp.status == 502
    async with client.get("/metrics") as resp:
        text = await resp.text()
    assert "specproxy_store_pending" in text and "specproxy_store_dropped_total 0.0" in text
    await client.close()  # the app's shutdown: the store is closed and flushed
    assert store.pending == 0 and store.dropped == 0
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT run_id, status FROM requests").fetchall()
    assert rows == [("app-run", 502)] * 3
