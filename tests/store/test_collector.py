"""The store's counters as Prometheus metrics on an injected registry."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from specproxy.metrics import STORE_DROPPED, STORE_PENDING, STORE_SPILLED, STORE_WRITTEN
from specproxy.store.collector import register_store_metrics
from specproxy.store.factory import open_store
from specproxy.store.memory import MemoryStore
from tests.store.conftest import make_record, store_config


async def test_metrics_follow_the_store(tmp_path: Path) -> None:
    store = open_store(store_config("memory://", tmp_path, max_buffer=2))
    assert isinstance(store, MemoryStore)
    registry = CollectorRegistry()
    register_store_metrics(store, registry)
    await store.start()
    store.fail_writes = True
    for i in range(5):
        store.record(make_record(i))

    def value(name: str) -> float | None:
        return registry.get_sample_value(name)

    assert value(STORE_PENDING) == 5
    assert value(STORE_SPILLED + "_total") == 3
    assert value(STORE_WRITTEN + "_total") == 0
    store.fail_writes = False
    await store.flush()
    assert value(STORE_PENDING) == 0
    assert value(STORE_WRITTEN + "_total") == 5
    assert value(STORE_DROPPED + "_total") == 0
    await store.close()
