"""Persistence of request records, engine samples and stats history (see `base.Store`).

`open_store(cfg.store, run_id=...)` picks the backend by URL; `register_store_metrics` exposes
its health counters on a Prometheus registry.
"""

from specproxy.store.base import ArmArrays, Store
from specproxy.store.buffered import BufferedStore
from specproxy.store.collector import StoreCollector, register_store_metrics
from specproxy.store.factory import open_store

__all__ = [
    "ArmArrays",
    "BufferedStore",
    "Store",
    "StoreCollector",
    "open_store",
    "register_store_metrics",
]
