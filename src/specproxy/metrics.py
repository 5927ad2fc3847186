"""Metric names and the proxy's own collectors.

Every Prometheus name specproxy exports is a constant here, so that the proxy, the scraper, the
stats job, the Grafana dashboard generator and the alert rules cannot drift apart. Collectors are
always created on an injected `CollectorRegistry`, never on the global one.

Conventions (https://prometheus.io/docs/practices/naming/): base units in the name (`_seconds`),
counters end in `_total`, values in 0..1 end in `_ratio`, labels are bounded (arm, endpoint,
stream, status, kind, position, metric, statistic, bound, window, model). The registry also carries
`process_*` (ProcessCollector) and `specproxy_build_info{version}`; `_created` series are off,
since a dashboard never reads them and they double every counter's series.

Latency buckets are log-spaced three per doubling (2^(1/3), about 26% apart) from 1 ms to 10 min:
59 buckets instead of the 141 of a 10% spacing. `benchmarks/bench_buckets.py` measures what that
costs `histogram_quantile` over lognormal latencies (median 5 ms..30 s, log-sd 0.1..1): P99 error
median 1.5%, worst 7.5-8.1% (10% spacing: 0.7-1.2%, worst 2.5-2.8%), P50 worst 1.1%; the
latency bucket series fall from 2,556 to 1,080 per proxy. That is below the effects the
dashboard is for (speculation gains are tens of percent); the CIs come from raw records, never
from buckets. Native histograms would need no bucket choice at all, but prometheus_client 0.26
only renders a native-histogram sample a custom collector computes itself (OpenMetrics 2.0 text),
and its `Histogram` has no native mode, so the classic buckets stay.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Iterable, Sequence

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from prometheus_client.values import MutexValue

from specproxy import __version__
from specproxy.errors import ErrorKind

__all__ = [
    "GATE_STATES",
    "LATENCY_BUCKETS",
    "TOKENS_PER_EVENT_BUCKETS",
    "TOKEN_BUCKETS",
    "VERDICT_STATES",
    "ProxyMetrics",
    "fast_increment",
    "fast_observe",
    "histogram_quantile",
    "log_buckets",
    "register_process_metrics",
]

# Proxy request metrics (labels: arm, endpoint, stream unless noted, and `model` on each: the
# client's model string bounded by fleet.models.ModelLabels, i.e. a served or allowed model, or
# "other").
REQUEST_DURATION = "specproxy_request_duration_seconds"
TTFT = "specproxy_time_to_first_token_seconds"
TPOT = "specproxy_time_per_output_token_seconds"
EVENT_GAP = "specproxy_event_gap_seconds"  # labels: arm, model
TOKENS_PER_EVENT = "specproxy_tokens_per_event"  # labels: arm, model
OUTPUT_TOKENS = "specproxy_output_tokens"  # labels: arm, model
PROXY_OVERHEAD = "specproxy_proxy_overhead_seconds"  # labels: arm, model; e2e minus upstream
REQUEST_ACCEPTANCE_LENGTH = "specproxy_request_acceptance_length"  # labels: arm, model
REQUESTS = "specproxy_requests"  # counter -> specproxy_requests_total{arm,status,model}
UPSTREAM_ERRORS = "specproxy_upstream_errors"  # counter -> ..._total{arm,kind,model}
# The `kind` values it counts: failures of the engine's answer, not the client leaving or the
# proxy cancelling a shadow.
UPSTREAM_ERROR_KINDS: tuple[ErrorKind, ...] = tuple(k for k in ErrorKind if not k.verdict_free)
SHADOW_SKIPPED = "specproxy_shadow_skipped"  # counter -> ..._total (cap reached, arm down)
# Failing open: a treatment's request served by the control: ..._total{from,to,reason}, reason
# one of records.RerouteReason's values (down, connect).
REROUTED = "specproxy_rerouted_requests"
ARM_UP = "specproxy_arm_up"  # gauge{arm}: 1 while the arm has an endpoint in rotation
# info -> specproxy_arm_info{arm,role,label_KEY...} 1: each configured arm's role (control |
# treatment), so rules and panels need not know the control's name (`[arms.NAME]`), and its
# configured labels as label_KEY (at most 16: `config.ARM_LABELS_MAX`)
ARM = "specproxy_arm"
# The proxy answered itself (bad JSON, too deep, too large, bad method): ..._total{reason}.
REJECTED = "specproxy_rejected_requests"  # reason: proxy.limits.Rejection's values
INFLIGHT = "specproxy_inflight_requests"  # gauge{arm}
BUILD = "specproxy_build"  # info -> specproxy_build_info{version} 1

# Engine metrics derived from each arm's vLLM /metrics (labels: arm).
ENGINE_UP = "specproxy_engine_up"  # + endpoint: one series per engine endpoint
ENGINE_ACCEPTANCE_RATIO = "specproxy_engine_draft_acceptance_ratio"
ENGINE_MEAN_ACCEPTANCE_LENGTH = "specproxy_engine_mean_acceptance_length"
ENGINE_POSITION_ACCEPTANCE_RATIO = "specproxy_engine_position_acceptance_ratio"  # + position
ENGINE_REQUESTS_RUNNING = "specproxy_engine_requests_running"
ENGINE_REQUESTS_WAITING = "specproxy_engine_requests_waiting"
ENGINE_KV_CACHE_USAGE = "specproxy_engine_kv_cache_usage_ratio"
# The engine's own cumulative generation-tokens counter (vllm:generation_tokens_total), passed
# through: rate() it in PromQL. It resets when the engine restarts, which rate() handles.
# + endpoint: each engine's own counter, so sum(rate(...)) is the arm's throughput.
ENGINE_GENERATION_TOKENS = "specproxy_engine_generation_tokens"  # counter -> ..._total
ENGINE_RESTARTS = "specproxy_engine_restarts"  # counter -> ..._total

# Optional GPU telemetry from each arm's NVIDIA dcgm-exporters (`scrape.dcgm`; labels: arm),
# combined over the arm's GPUs; only arms with `dcgm_urls` have these series.
GPU_EXPORTER_UP = "specproxy_gpu_exporter_up"  # + endpoint: one series per exporter URL
GPU_UTILIZATION_RATIO = "specproxy_gpu_utilization_ratio"  # mean over GPUs
GPU_MEMORY_BANDWIDTH_RATIO = "specproxy_gpu_memory_bandwidth_ratio"  # busiest GPU
GPU_SM_CLOCK = "specproxy_gpu_sm_clock_hertz"  # mean over GPUs
GPU_TEMPERATURE = "specproxy_gpu_temperature_celsius"  # hottest GPU
GPU_THERMAL_THROTTLED = "specproxy_gpu_thermal_throttled"  # 1 if any GPU has a thermal reason

# Runtime arm control (`specproxy.control`): what this replica applies now.
ARM_WEIGHT = "specproxy_arm_weight_ratio"  # gauge{arm}: its share; the baseline gets the rest
EXPERIMENT_STOPPED = "specproxy_experiment_stopped"  # 1 while the kill switch is on
# The guarded ramp (control.ramp): from the stored result's `ramp`, on every replica
RAMP_STEP = "specproxy_ramp_step"  # gauge{arm}: 1-based step of the schedule, 0 off it or cut
RAMP_DECISIONS = "specproxy_ramp_decisions"  # counter -> ..._total{arm,move,dry_run}
RAMP_MOVES = ("start", "step", "cut")  # the `move` values it counts (holds are not counted)
CONTROL_POLL_FAILURES = "specproxy_control_poll_failures"  # counter -> ..._total
ENDPOINT_EVENTS = "specproxy_endpoint_events"  # counter -> ..._total
ENDPOINT_EVENT_KINDS = ("ejected", "readmitted")

# Store health.
STORE_PENDING = "specproxy_store_pending"
STORE_DROPPED = "specproxy_store_dropped"  # counter -> ..._total; must stay 0
STORE_SPILLED = "specproxy_store_spilled"  # counter -> ..._total
STORE_WRITTEN = "specproxy_store_written"  # counter -> ..._total

# Results of the stats job (labels: model, window, plus those noted).
SPEEDUP = "specproxy_speedup_ratio"  # + metric, statistic, bound=estimate|lower|upper
SAMPLES = "specproxy_samples"  # + arm
# Speedups by condition (`stats.segments`, the whole-run window of all models): + metric,
# dimension (load|prompt|output|temperature|category), band (<= 38 per metric), bound; a band
# with too little data has no series. A load band's mean calls in flight per engine (where its
# speedup was measured): + metric, band. The crossover load (calls in flight per engine):
# + metric, bound; a bound beyond the observed range has no series.
SEGMENT_SPEEDUP = "specproxy_segment_speedup_ratio"
SEGMENT_IN_FLIGHT = "specproxy_segment_in_flight_requests"
CROSSOVER_LOAD = "specproxy_crossover_in_flight_requests"
# A state set (OpenMetrics): one series per state, 1 for the current one, 0 for the others, the
# state in a label named like the metric: specproxy_verdict{metric,specproxy_verdict="faster"}.
VERDICT = "specproxy_verdict"  # + metric
VERDICT_STATES = ("faster", "inconclusive", "slower")
P99_SLOWDOWN = "specproxy_p99_slowdown"  # + metric; 1 while the anytime-valid test rejects
# The rollout gate of each window (`stats.gate`), a state set like the verdict:
# specproxy_gate{model,window,specproxy_gate="pass"|"wait"|"fail"}; Argo Rollouts and Flagger
# read it (deploy/kubernetes/gates/).
GATE = "specproxy_gate"
GATE_STATES = ("pass", "wait", "fail")
# The diagnosis's low-acceptance rule (`stats.diagnosis.acceptance_check`): tokens a speculative
# step yields, and the 1 + k c target steps it costs; the SpecProxyLowAcceptance alert compares
# them, so the rule is computed in one place. Absent while k or acceptance is unknown.
SPECULATION_TOKENS_PER_STEP = "specproxy_speculation_tokens_per_step"
SPECULATION_BREAK_EVEN = "specproxy_speculation_break_even_tokens_per_step"
# Recording rules (deploy/prometheus/rules/specproxy.rules.yml), fleet-wide 5-minute series.
RECORDED_REQUEST_RATE = "arm:specproxy_requests:rate5m"
RECORDED_FAILED_RATIO = "arm:specproxy_requests_failed:ratio_rate5m"
RECORDED_TOKENS_PER_EVENT = "arm:specproxy_tokens_per_event:mean5m"
RECORDED_P99_RATIO = "specproxy:request_duration_seconds:p99_ratio_5m"
STATS_LAST_RUN = "specproxy_stats_last_run_timestamp_seconds"  # the result's computed_at
STATS_DATA_LAG = "specproxy_stats_data_lag_seconds"  # computed_at - newest data the result saw
# usable requests stamped after now + stats.future_skew_s: in no window (`compute_stats`)
STATS_FUTURE_ROWS = "specproxy_stats_future_rows"
STATS_LEADER = "specproxy_stats_leader"  # 1 in the replica that computes, 0 in followers


def log_buckets(low: float, high: float, ratio: float) -> tuple[float, ...]:
    """Upper bounds low, low*ratio, ... up to and including the first bound >= high."""
    count = math.ceil(math.log(high / low) / math.log(ratio))
    return tuple(float(f"{low * ratio**i:.6g}") for i in range(count + 1))


LATENCY_BUCKETS = log_buckets(0.001, 600.0, 2 ** (1 / 3))
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)
# 0.99 just below 1: a request whose events all carry one token sits in (0.99, 1], so a
# histogram_quantile over the baseline reads 0.995..1, not the 0.5 that interpolating from 0 gave.
TOKENS_PER_EVENT_BUCKETS = (0.5, 0.99, 1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 10, 12, 16, 24, 32)


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[float]) -> float:
    """Prometheus's `histogram_quantile` from per-bucket (not cumulative) `counts`.

    `counts` has one entry per finite bound plus the +Inf bucket. Linear interpolation inside
    the bucket holding rank q * total, from 0 below the first bound (promql/quantile.go); in the
    +Inf bucket the highest finite bound. What a dashboard draws from these buckets.
    """
    total = sum(counts)
    if not total:
        return math.nan
    rank = q * total
    cumulative = 0.0
    for i, count in enumerate(counts):
        if count > 0 and cumulative + count >= rank:
            if i >= len(bounds):
                return bounds[-1]
            lower = bounds[i - 1] if i > 0 else 0.0
            return lower + (bounds[i] - lower) * (rank - cumulative) / count
        cumulative += count
    return bounds[-1]


def register_process_metrics(registry: CollectorRegistry) -> None:
    """`process_*` (CPU, memory, open fds, start time) and `specproxy_build_info{version}`.

    Also turns the `_created` series off; prometheus_client keeps that switch per process.
    """
    prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
    ProcessCollector(registry=registry)
    Info(BUILD, "specproxy build; the value is always 1.", registry=registry).info(
        {"version": __version__}
    )


class _Barrier(Collector):
    """Collected before the proxy's collectors: the calls already over get their samples first
    (`before_collect`). It yields no metric."""

    def __init__(self) -> None:
        self.settle: Callable[[], None] | None = None

    def collect(self) -> Iterable[Metric]:
        if self.settle is not None:
            self.settle()
        return ()


class ProxyMetrics:
    """The live collectors the request path updates, on one injected registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._barrier = _Barrier()
        registry.register(self._barrier)  # first: a collect settles before it reads
        register_process_metrics(registry)
        lat = LATENCY_BUCKETS
        self.request_duration = Histogram(
            REQUEST_DURATION,
            "Wall-clock time from request received to last byte sent, by arm.",
            ["arm", "endpoint", "stream", "model"],
            buckets=lat,
            registry=registry,
        )
        self.ttft = Histogram(
            TTFT,
            "Time from request received to the first SSE event with content.",
            ["arm", "endpoint", "model"],
            buckets=lat,
            registry=registry,
        )
        self.tpot = Histogram(
            TPOT,
            "(E2E - TTFT) / (output tokens - 1): per-token decode time.",
            ["arm", "endpoint", "model"],
            buckets=lat,
            registry=registry,
        )
        self.event_gap = Histogram(
            EVENT_GAP,
            "Gap between consecutive SSE content events (one event per engine step).",
            ["arm", "model"],
            buckets=lat,
            registry=registry,
        )
        self.tokens_per_event = Histogram(
            TOKENS_PER_EVENT,
            "Mean output tokens per SSE content event, per request.",
            ["arm", "model"],
            buckets=TOKENS_PER_EVENT_BUCKETS,
            registry=registry,
        )
        self.output_tokens = Histogram(
            OUTPUT_TOKENS,
            "Output tokens per request.",
            ["arm", "model"],
            buckets=TOKEN_BUCKETS,
            registry=registry,
        )
        self.proxy_overhead = Histogram(
            PROXY_OVERHEAD,
            "E2E minus upstream-only time: what the proxy itself added.",
            ["arm", "model"],
            buckets=log_buckets(0.00001, 1.0, 1.25),
            registry=registry,
        )
        self.request_acceptance_length = Histogram(
            REQUEST_ACCEPTANCE_LENGTH,
            "Per-request mean acceptance length reported by vLLM (speculative arm).",
            ["arm", "model"],
            buckets=TOKENS_PER_EVENT_BUCKETS,
            registry=registry,
        )
        self.requests = Counter(
            REQUESTS,
            "Requests recorded, by arm, HTTP status and model.",
            ["arm", "status", "model"],
            registry=registry,
        )
        self.upstream_errors = Counter(
            UPSTREAM_ERRORS,
            f"Upstream failures by arm and kind ({', '.join(UPSTREAM_ERROR_KINDS)}).",
            ["arm", "kind", "model"],
            registry=registry,
        )
        self.rejected = Counter(
            REJECTED,
            "Requests the proxy answered itself, by reason (invalid_json, json_too_deep, "
            "body_too_large, headers_too_large, method_not_allowed); never forwarded or recorded.",
            ["reason"],
            registry=registry,
        )
        self.shadow_skipped = Counter(
            SHADOW_SKIPPED,
            "Mirrored requests skipped because the shadow concurrency cap was reached or the "
            "shadow's arm (or the primary's, failing open) was down.",
            registry=registry,
        )
        self.rerouted = Counter(
            REROUTED,
            "Requests routed to a treatment arm that was down, served by the control arm instead "
            "(failing open; left out of the comparison), by reason (down, connect).",
            ["from", "to", "reason"],
            registry=registry,
        )
        self.arm_role = Info(
            ARM,
            "Each configured arm and its role (control or treatment); the value is always 1.",
            ["arm"],
            registry=registry,
        )
        self.arm_up = Gauge(
            ARM_UP,
            "1 while the arm has an endpoint in rotation (not every endpoint ejected), else 0.",
            ["arm"],
            registry=registry,
        )
        self.inflight = Gauge(
            INFLIGHT, "Requests in flight through the proxy, by arm.", ["arm"], registry=registry
        )
        self.arm_weight = Gauge(
            ARM_WEIGHT,
            "Share of the traffic each arm gets now (0 while paused or stopped; the baseline, "
            "the control arm, gets the rest).",
            ["arm"],
            registry=registry,
        )
        self.experiment_stopped = Gauge(
            EXPERIMENT_STOPPED,
            "1 while the experiment is stopped (every request goes to the baseline).",
            registry=registry,
        )
        self.control_poll_failures = Counter(
            CONTROL_POLL_FAILURES,
            "Reads of the arm-control events that failed (the replica kept its last state).",
            registry=registry,
        )
        self.endpoint_events = Counter(
            ENDPOINT_EVENTS,
            "Engine endpoints ejected from an arm's pool after consecutive failures, and "
            f"readmitted by a probe, by arm and event ({', '.join(ENDPOINT_EVENT_KINDS)}).",
            ["arm", "event"],
            registry=registry,
        )

    def before_collect(self, settle: Callable[[], None]) -> None:
        """Call `settle` at the start of every collect of the registry: the request path's
        read barrier (`proxy.backlog`)."""
        self._barrier.settle = settle


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

    def observe_many(self, amounts: Iterable[float]) -> None:
        """`observe` of each value in turn (the same sum, added in the same order), in one call:
        a stream's gaps between events are a dozen or hundreds of values."""
        bounds = self._bounds
        buckets = self._buckets
        bucket_of = bisect.bisect_left
        total = self._sum
        value = total._value
        for amount in amounts:
            if amount == amount:
                buckets[bucket_of(bounds, amount)]._value += 1
            value += amount
        total._value = value


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


def fast_observe_many(child: Histogram) -> Callable[[Iterable[float]], None]:
    """`fast_observe` for many values in one call (each observed in turn); same rule."""
    observe = fast_observe(child)
    histogram = getattr(observe, "__self__", None)
    if type(histogram) is _FastHistogram:
        return histogram.observe_many

    def observe_each(amounts: Iterable[float]) -> None:
        for amount in amounts:
            observe(amount)

    return observe_each


def fast_increment(child: Counter) -> Callable[[], None]:
    """`child.inc` (by one) for a labelled counter child; same single-writer rule as above."""
    value = getattr(child, "_value", None)
    if type(value) is MutexValue:
        return _FastCounter(value).inc
    return child.inc
