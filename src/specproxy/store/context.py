"""The store's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

`create_app(..., with_store=True)` adds it. It opens the store of `cfg.store` (migrations, spill
replay), makes it the app's `RECORDER`, exposes its health counters on the app's registry, and
publishes it under `STORE` for the stats job. On shutdown (SIGTERM/SIGINT through aiohttp's
graceful exit) it closes the store, which flushes every buffered record or spills it to disk.
Contexts unwind in reverse, so the forwarder has handed over its last record before this runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, RECORDER, REGISTRY, STORE
from specproxy.store.collector import register_store_metrics
from specproxy.store.factory import open_store

__all__ = ["store_ctx"]


async def store_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the store and record into it; close (flush) it when the app shuts down."""
    cfg = app[CONFIG]
    store = open_store(cfg.store, run_id=cfg.run_id)
    await store.start()
    collector = register_store_metrics(store, app[REGISTRY])
    app[STORE] = store
    app[RECORDER] = store
    try:
        yield
    finally:
        await store.close()
        app[REGISTRY].unregister(collector)
