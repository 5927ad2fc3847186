"""The store's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

`create_app(..., with_store=True)` adds it. It opens the store of `cfg.store` (migrations, spill
replay), makes it the app's `RECORDER`, exposes its health counters on the app's registry, and
publishes it under `STORE` for the stats job. Its rollups are keyed by the fleet's bounded model
labels (`Sink.label_models`): the fleet starts after the store, so until it exists (a spill
replayed at start) a model outside `model_allow` is rolled up as "other", never as the
client's string. On shutdown (SIGTERM/SIGINT through aiohttp's
graceful exit) it closes the store, which flushes every buffered record or spills it to disk.
Contexts unwind in reverse, so the forwarder has handed over its last record before this runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, FLEET, RECORDER, REGISTRY, STORE
from specproxy.fleet.models import ModelLabels
from specproxy.store.collector import register_store_metrics
from specproxy.store.factory import open_store

__all__ = ["store_ctx"]


async def store_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the store and record into it; close (flush) it when the app shuts down."""
    cfg = app[CONFIG]
    store = open_store(cfg.store, run_id=cfg.run_id)
    before_fleet = ModelLabels(cfg.model_allow)

    def model_label(model: str) -> str:
        fleet = app.get(FLEET)
        return (fleet.labels if fleet is not None else before_fleet).label(model)

    store.label_models(model_label)
    await store.start()
    collector = register_store_metrics(store, app[REGISTRY])
    app[STORE] = store
    app[RECORDER] = store
    try:
        yield
    finally:
        await store.close()
        app[REGISTRY].unregister(collector)
