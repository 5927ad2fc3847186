"""Metric names and the proxy's own collectors.

Every Prometheus name specproxy exports is a constant here, so that the proxy, the scraper, the
stats job, the Grafana dashboard generator and the alert rules cannot drift apart. Collectors are
always created on an injected `CollectorRegistry`, never on the global one.

Latency buckets are log-spaced about 10% apart from 1 ms to 10 min. `histogram_quantile`
interpolates linearly inside a bucket, so its error on a P99 is bounded by the bucket width:
10%-wide buckets keep Grafana's P99 within ~5% of the true value, which is below the effects
we care about (speculation gains are tens of percent). Exact CIs come from raw records, not buckets.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.values import MutexValue

__all__ = [
    "LATENCY_BUCKETS",
    "TOKENS_PER_EVENT_BUCKETS",
    "TOKEN_BUCKETS",
    "ProxyMetrics",
    "fast_increment",
    "fast_observe",
    "log_buckets",
]

# Proxy request metrics (labels: arm, endpoint, stream unless noted).
REQUEST_DURATION = "specproxy_request_duration_seconds"
TTFT = "specproxy_time_to_first_token_seconds"
TPOT = "specproxy_time_per_output_token_seconds"
EVENT_GAP = "specproxy_event_gap_seconds"  # labels: arm
TOKENS_PER_EVENT = "specproxy_tokens_per_event"  # labels: arm
OUTPUT_TOKENS = "specproxy_output_tokens"  # labels: arm
PROXY_OVERHEAD = "specproxy_proxy_overhead_seconds"  # labels: arm; e2e minus upstream time
REQUEST_ACCEPTANCE_LENGTH = "specproxy_request_acceptance_length"  # labels: arm
REQUESTS = "specproxy_requests"  # counter -> specproxy_requests_total{arm,status}
UPSTREAM_ERRORS = "specproxy_upstream_errors"  # counter -> ..._total{arm,kind}
SHADOW_SKIPPED = "specproxy_shadow_skipped"  # counter -> ..._total (shadow cap reached)
INFLIGHT = "specproxy_inflight_requests"  # gauge{arm}

# Engine metrics derived from each arm's vLLM /metrics (labels: arm).
ENGINE_UP = "specproxy_engine_up"  # + endpoint: one series per engine endpoint
ENGINE_ACCEPTANCE_RATE = "specproxy_engine_acceptance_rate"
ENGINE_MEAN_ACCEPTANCE_LENGTH = "specproxy_engine_mean_acceptance_length"
ENGINE_POSITION_ACCEPTANCE_RATE = "specproxy_engine_position_acceptance_rate"  # + position
ENGINE_REQUESTS_RUNNING = "specproxy_engine_requests_running"
ENGINE_REQUESTS_WAITING = "specproxy_engine_requests_waiting"
ENGINE_KV_CACHE_USAGE = "specproxy_engine_kv_cache_usage"
ENGINE_GENERATION_TOKENS_RATE = "specproxy_engine_generation_tokens_per_second"
ENGINE_RESTARTS = "specproxy_engine_restarts"  # counter -> ..._total

# Store health.
STORE_PENDING = "specproxy_store_pending"
STORE_DROPPED = "specproxy_store_dropped"  # counter -> ..._total; must stay 0
STORE_SPILLED = "specproxy_store_spilled"  # counter -> ..._total
STORE_WRITTEN = "specproxy_store_written"  # counter -> ..._total

# Results of the stats job (labels: model, window, plus those noted).
SPEEDUP = "specproxy_speedup"  # + metric, statistic, bound=estimate|lower|upper
SAMPLES = "specproxy_samples"  # + arm
VERDICT = "specproxy_verdict"  # + metric; 1 faster, 0 inconclusive, -1 slower
P99_SLOWDOWN = "specproxy_p99_slowdown"  # + metric; 1 while the anytime-valid test rejects
STATS_LAST_RUN = "specproxy_stats_last_run_timestamp_seconds"


def log_buckets(low: float, high: float, ratio: float) -> tuple[float, ...]:
    """Upper bounds low, low*ratio, ... up to and including the first bound >= high."""
    count = math.ceil(math.log(high / low) / math.log(ratio))
    return tuple(float(f"{low * ratio**i:.6g}") for i in range(count + 1))


LATENCY_BUCKETS = log_buckets(0.001, 600.0, 1.1)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
TOKENS_PER_EVENT_BUCKETS = (1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)


class ProxyMetrics:
    """The live collectors the request path updates, on one injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        lat = LATENCY_BUCKETS
        self.request_duration = Histogram(
            REQUEST_DURATION,
            "Wall-clock time from request received to last byte sent, by arm.",
            ["arm", "endpoint", "stream"],
            buckets=lat,
            registry=registry,
        )
        self.ttft = Histogram(
            TTFT,
            "Time from request received to the first SSE event with content.",
            ["arm", "endpoint"],
            buckets=lat,
            registry=registry,
        )
        self.tpot = Histogram(
            TPOT,
            "(E2E - TTFT) / (output tokens - 1): per-token decode time.",
            ["arm", "endpoint"],
            buckets=lat,
            registry=registry,
        )
        self.event_gap = Histogram(
            EVENT_GAP,
            "Gap between consecutive SSE content events (one event per engine step).",
            ["arm"],
            buckets=lat,
            registry=registry,
        )
        self.tokens_per_event = Histogram(
            TOKENS_PER_EVENT,
            "Mean output tokens per SSE content event, per request.",
            ["arm"],
            buckets=TOKENS_PER_EVENT_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Histogram(
            OUTPUT_TOKENS,
            "Output tokens per request.",
            ["arm"],
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.proxy_overhead = Histogram(
            PROXY_OVERHEAD,
            "E2E minus upstream-only time: what the proxy itself added.",
            ["arm"],
            buckets=log_buckets(0.00001, 1.0, 1.25),
            registry=registry,
        )
        self.request_acceptance_length = Histogram(
            REQUEST_ACCEPTANCE_LENGTH,
            "Per-request mean acceptance length reported by vLLM (speculative arm).",
            ["arm"],
            buckets=TOKENS_PER_EVENT_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            REQUESTS,
            "Requests recorded, by arm and HTTP status.",
            ["arm", "status"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            UPSTREAM_ERRORS,
            "Upstream failures by arm and kind (connect, timeout, broken, http_4xx, http_5xx).",
            ["arm", "kind"],
            registry=registry,
        )
        self.shadow_skipped = Counter(
            SHADOW_SKIPPED,
            "Mirrored requests skipped because the shadow concurrency cap was reached.",
            registry=registry,
        )
        self.inflight = Gauge(
            INFLIGHT, "Requests in flight through the proxy, by arm.", ["arm"], registry=registry
        )


# --------------------------------------------------------------------------- request path

# prometheus_client's `observe` takes a lock per value and scans the ~140 latency buckets linearly
# (about 1.2 us per call; the proxy makes 4-5 per request). The event loop thread is the only
# writer of the proxy's collectors (a scrape, even from a worker thread, only reads), so the
# request path may add to the values directly. Anything but the plain single-process value class
# (e.g. multiprocess mode) keeps the library's own method.


class _FastHistogram:
    __slots__ = ("_bounds", "_buckets", "_sum")

    def __init__(self, bounds: list[float], buckets: list[MutexValue], total: MutexValue) -> None:
        self._bounds = bounds
        self._buckets = buckets
        self._sum = total

    def observe(self, amount: float) -> None:
        if amount == amount:  # a NaN lands in no bucket, as in prometheus_client
            self._buckets[bisect.bisect_left(self._bounds, amount)]._value += 1
        self._sum._value += amount


class _FastCounter:
    __slots__ = ("_value",)

    def __init__(self, value: MutexValue) -> None:
        self._value = value

    def inc(self) -> None:
        self._value._value += 1


def fast_observe(child: Histogram) -> Callable[[float], None]:
    """`child.observe` for a labelled histogram child, without locks or a linear bucket scan.

    Only for collectors written from one thread (the event loop); same samples as `observe`.
    """
    bounds = getattr(child, "_upper_bounds", None)
    buckets = getattr(child, "_buckets", None)
    total = getattr(child, "_sum", None)
    if (
        isinstance(bounds, list)
        and isinstance(buckets, list)
        and len(buckets) == len(bounds)
        and bounds
        and bounds[-1] == math.inf
        and type(total) is MutexValue
        and all(type(b) is MutexValue for b in buckets)
    ):
        return _FastHistogram(bounds, buckets, total).observe
    return child.observe


def fast_increment(child: Counter) -> Callable[[], None]:
    """`child.inc` (by one) for a labelled counter child; same single-writer rule as above."""
    value = getattr(child, "_value", None)
    if type(value) is MutexValue:
        return _FastCounter(value).inc
    return child.inc
