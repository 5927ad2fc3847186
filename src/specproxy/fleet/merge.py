"""Several processes' /metrics pages -> one page: what `serve --workers N` exposes.

Each worker keeps its own plain registry (so the request path's lock-free histograms stay as
they are, see `metrics.fast_observe`) and the worker that answers a scrape merges every
worker's page. How a series combines depends on what it measures:

- counters, histograms and summaries: summed (requests, buckets, sums, counts add up);
- gauges of the process's own load (`SUMMED_GAUGES`: requests in flight, store backlog, memory,
  open files): summed;
- `process_start_time_seconds`: the earliest;
- every other gauge (engine state, the stats leader's result, `specproxy_stats_leader`,
  `specproxy_build_info`): the largest. Each worker scrapes the same engines and serves the same
  stored stats result, so these agree up to scrape timing; the leader gauge reads 1 when one
  worker leads.

Pure: text in, text out.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from specproxy import metrics as m

__all__ = ["SUMMED_GAUGES", "merge_pages"]

SUMMED_GAUGES: Final = frozenset(
    {
        m.INFLIGHT,
        m.STORE_PENDING,
        "process_resident_memory_bytes",
        "process_virtual_memory_bytes",
        "process_open_fds",
    }
)
_SUMMED_TYPES: Final = frozenset({"counter", "histogram", "summary", "gaugehistogram"})
_EARLIEST: Final = frozenset({"process_start_time_seconds"})

SampleKey = tuple[str, tuple[tuple[str, str], ...]]


def merge_pages(pages: Sequence[str]) -> bytes:
    """One exposition page from several (Prometheus text format)."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[SampleKey, float]] = {}
    for page in pages:
        for family in text_string_to_metric_families(page):
            known = families.setdefault(
                family.name, Metric(family.name, family.documentation, family.type, family.unit)
            )
            into = values.setdefault(family.name, {})
            combine = _combiner(known)
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = into.get(key)
                into[key] = sample.value if old is None else combine(old, sample.value)
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(families.values()))
    return generate_latest(registry)


def _combiner(family: Metric) -> Callable[[float, float], float]:
    if family.type in _SUMMED_TYPES or family.name in SUMMED_GAUGES:
        return operator.add
    if family.name in _EARLIEST:
        return min
    return max


class _Fixed(Collector):
    def __init__(self, families: Iterable[Metric]) -> None:
        self._families = list(families)

    def collect(self) -> Iterator[Metric]:
        yield from self._families
