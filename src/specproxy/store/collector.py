"""Prometheus view of a store's health, read from its counters at scrape time.

A custom collector (rather than Gauges the store would have to keep updating) means the numbers
are exact at every scrape and the store's hot path does no metrics work at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy.metrics import STORE_DROPPED, STORE_PENDING, STORE_SPILLED, STORE_WRITTEN

__all__ = ["StoreCollector", "StoreCounters", "register_store_metrics"]


class StoreCounters(Protocol):
    """What the collector reads; `BufferedStore` provides it."""

    @property
    def pending(self) -> int: ...

    @property
    def dropped(self) -> int: ...

    @property
    def spilled(self) -> int: ...

    @property
    def written(self) -> int: ...


class StoreCollector(Collector):
    def __init__(self, store: StoreCounters) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            STORE_PENDING,
            "Rows not yet in the store (buffered, being written, or in spill files).",
            value=self.store.pending,
        )
        yield CounterMetricFamily(
            STORE_DROPPED, "Rows lost for good; must stay 0.", value=self.store.dropped
        )
        yield CounterMetricFamily(
            STORE_SPILLED,
            "Rows written to the local spill file while the store was slow or down.",
            value=self.store.spilled,
        )
        yield CounterMetricFamily(
            STORE_WRITTEN, "Rows written to the store.", value=self.store.written
        )


def register_store_metrics(store: StoreCounters, registry: CollectorRegistry) -> StoreCollector:
    """Expose `store`'s counters on `registry` (call once per registry)."""
    collector = StoreCollector(store)
    registry.register(collector)
    return collector
