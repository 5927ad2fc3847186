"""The request path's fast observe/increment give exactly the samples prometheus_client gives."""

from __future__ import annotations

import itertools
import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from specproxy import __version__
from specproxy.metrics import (
    LATENCY_BUCKETS,
    TOKENS_PER_EVENT_BUCKETS,
    ProxyMetrics,
    fast_increment,
    fast_observe,
    fast_observe_many,
    histogram_quantile,
    log_buckets,
)


def _samples(registry: CollectorRegistry) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, s.labels, s.value)
        for metric in registry.collect()
        for s in metric.samples
        if not s.name.endswith("_created")
    ]


def test_fast_observe_matches_the_library_on_every_bucket_edge() -> None:
    values = [0.0, -1.0, 1e-9, math.inf, 1e9, 0.5, 0.0005, 3]
    values += list(LATENCY_BUCKETS)  # exactly on a bound: counted in that bucket (le)
    values += [b * 1.0000001 for b in LATENCY_BUCKETS]  # just above a bound: the next one
    values += [b * 0.9999999 for b in LATENCY_BUCKETS]
    reference, fast = CollectorRegistry(), CollectorRegistry()
    ref_h = Histogram("h", "h", ["arm"], buckets=LATENCY_BUCKETS, registry=reference)
    fast_h = Histogram("h", "h", ["arm"], buckets=LATENCY_BUCKETS, registry=fast)
    observe = fast_observe(fast_h.labels("a"))
    assert observe != fast_h.labels("a").observe  # the fast path is the one under test
    for value in values:
        ref_h.labels("a").observe(value)
        observe(value)
    assert _samples(fast) == _samples(reference)
    assert fast.get_sample_value("h_count", {"arm": "a"}) == len(values)


def test_fast_observe_many_matches_the_library_value_by_value() -> None:
    """Every bucket, the count and the sum (added in the same order: bit for bit) of values
    observed many at a time equal the library's one at a time; then a NaN lands in no bucket."""
    values = [0.1, 1e-9, 3.0, 0.0005, *LATENCY_BUCKETS, 0.7, 1e9, 1 / 3, 0.2, 0.1]
    reference, fast = CollectorRegistry(), CollectorRegistry()
    ref_h = Histogram("h", "h", ["arm"], buckets=LATENCY_BUCKETS, registry=reference)
    fast_h = Histogram("h", "h", ["arm"], buckets=LATENCY_BUCKETS, registry=fast)
    observe_many = fast_observe_many(fast_h.labels("a"))
    assert getattr(observe_many, "__func__", None) is not None  # the fast path, not the loop
    for value in values:
        ref_h.labels("a").observe(value)
    observe_many(values[:5])
    observe_many(())
    observe_many(values[5:])
    assert _samples(fast) == _samples(reference)
    ref_h.labels("a").observe(math.nan)
    observe_many([math.nan])
    ref = {(n, s.get("le")): v for n, s, v in _samples(reference)}
    got = {(n, s.get("le")): v for n, s, v in _samples(fast)}
    assert ref.keys() == got.keys()
    for key, value in ref.items():
        assert value == got[key] or (math.isnan(value) and math.isnan(got[key])), key
    assert got[("h_count", None)] == len(values)


def test_fast_observe_puts_nan_in_no_bucket_like_the_library() -> None:
    reference, fast = CollectorRegistry(), CollectorRegistry()
    buckets = log_buckets(0.001, 1.0, 2.0)
    ref_h = Histogram("h", "h", buckets=buckets, registry=reference)
    fast_h = Histogram("h", "h", ["arm"], buckets=buckets, registry=fast)
    ref_h.observe(math.nan)
    fast_observe(fast_h.labels("a"))(math.nan)
    ref = {(n, s.get("le")): v for n, s, v in _samples(reference)}
    got = {(n, s.get("le")): v for n, s, v in _samples(fast)}
    assert ref.keys() == got.keys()
    for key, value in ref.items():
        assert value == got[key] or (math.isnan(value) and math.isnan(got[key])), key
    assert got[("h_count", None)] == 0.0


def test_fast_increment_counts_like_the_library() -> None:
    registry = CollectorRegistry()
    counter = Counter("c", "c", ["arm", "status"], registry=registry)
    inc = fast_increment(counter.labels("a", "200"))
    for _ in range(5):
        inc()
    counter.labels("a", "200").inc()
    assert registry.get_sample_value("c_total", {"arm": "a", "status": "200"}) == 6.0


def test_unknown_value_classes_fall_back_to_the_library_method() -> None:
    class Other:
        def observe(self, amount: float) -> None:
            self.seen = amount

        def inc(self) -> None:
            self.seen = 1.0

    other = Other()
    assert fast_observe(other) == other.observe  # type: ignore[arg-type]
    assert fast_increment(other) == other.inc  # type: ignore[arg-type]
    fast_observe_many(other)([1.0, 2.5])  # type: ignore[arg-type]
    assert other.seen == 2.5  # each value through the library's method


def test_registry_has_process_build_info_and_no_created_series() -> None:
    registry = CollectorRegistry()
    metrics = ProxyMetrics(registry)
    metrics.requests.labels("speculative", "200", "m").inc()
    text = generate_latest(registry).decode()
    assert registry.get_sample_value("specproxy_build_info", {"version": __version__}) == 1.0
    assert registry.get_sample_value("process_cpu_seconds_total") is not None
    assert "_created" not in text
    assert 'specproxy_requests_total{arm="speculative",model="m",status="200"} 1.0' in text


def test_histogram_quantile_interpolates_like_prometheus() -> None:
    bounds = (1.0, 2.0, 4.0)
    assert histogram_quantile(0.5, bounds, [0, 10, 0, 0]) == 1.5  # halfway through (1, 2]
    assert histogram_quantile(0.5, bounds, [10, 0, 0, 0]) == 0.5  # first bucket starts at 0
    assert histogram_quantile(0.99, bounds, [0, 0, 0, 10]) == 4.0  # +Inf: highest finite bound
    assert math.isnan(histogram_quantile(0.5, bounds, [0, 0, 0, 0]))


def test_tokens_per_event_of_one_reads_one_not_a_half() -> None:
    registry = CollectorRegistry()
    histogram = ProxyMetrics(registry).tokens_per_event.labels("baseline", "m")
    for _ in range(100):
        histogram.observe(1.0)
    bounds = list(TOKENS_PER_EVENT_BUCKETS)
    cumulative = [
        registry.get_sample_value(
            "specproxy_tokens_per_event_bucket", {"arm": "baseline", "model": "m", "le": le}
        )
        or 0.0
        for le in [*(str(float(b)) for b in bounds), "+Inf"]
    ]
    counts = [c - p for c, p in zip(cumulative, [0.0, *cumulative[:-1]], strict=True)]
    assert 0.99 <= histogram_quantile(0.5, bounds, counts) <= 1.0


def test_latency_buckets_are_three_per_doubling_from_1ms_to_10min() -> None:
    assert LATENCY_BUCKETS[0] == 0.001 and LATENCY_BUCKETS[-1] >= 600.0 > LATENCY_BUCKETS[-2]
    ratios = [b / a for a, b in itertools.pairwise(LATENCY_BUCKETS)]
    assert all(abs(r - 2 ** (1 / 3)) < 1e-4 for r in ratios)
