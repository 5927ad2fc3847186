"""The scraper's state as version-independent Prometheus series on the proxy's /metrics.

`up` is per engine endpoint (`arm`, `endpoint` = its base URL; at most the arm's configured or
resolved pool, see `fleet.discovery.MAX_ENDPOINTS`); every other series is the arm's, summed or
combined over its endpoints (`scrape.aggregate`).

A custom collector rather than live Gauges: the values are read from the scraper's latest state
at collection time, so a series exists only while its value is known. An arm without
speculative metrics (the baseline) has no acceptance series at all, and a down arm keeps only
`up` and its restart count: absent means unknown, a zero would be a false measurement.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from specproxy import metrics
from specproxy.records import Arm
from specproxy.scrape.loop import ArmState

__all__ = ["EngineCollector", "register_engine_collector"]


class EngineCollector(Collector):
    """Exports every arm's engine state, labelled by `arm`."""

    def __init__(self, states: Mapping[Arm, ArmState]) -> None:
        self._states = states

    def describe(self) -> Iterable[Metric]:
        return _Families().all()

    def collect(self) -> Iterable[Metric]:
        f = _Families()
        for arm, state in self._states.items():
            label = [arm]
            f.restarts.add_metric(label, float(state.restarts))
            for url, endpoint in state.endpoints.items():
                if endpoint.up is not None:
                    f.up.add_metric([arm, url], 1.0 if endpoint.up else 0.0)
                tokens = endpoint.snapshot.generation_tokens if endpoint.snapshot else None
                if endpoint.up and tokens is not None:
                    f.generation_tokens.add_metric([arm, url], tokens)
            if not state.up:
                continue
            if state.acceptance_rate is not None:
                f.acceptance.add_metric(label, state.acceptance_rate)
            if state.mean_acceptance_length is not None:
                f.length.add_metric(label, state.mean_acceptance_length)
            for pos, rate in enumerate(state.position_acceptance or ()):
                f.position.add_metric([arm, str(pos)], rate)
            sample = state.sample
            if sample is None:
                continue
            for family, value in (
                (f.running, sample.requests_running),
                (f.waiting, sample.requests_waiting),
                (f.kv_cache, sample.kv_cache_usage),
            ):
                if value is not None:
                    family.add_metric(label, value)
        return f.all()


class _Families:
    """Fresh, empty metric families for one collection."""

    def __init__(self) -> None:
        def gauge(name: str, doc: str, *extra: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=["arm", *extra])

        self.up = gauge(
            metrics.ENGINE_UP,
            "1 if the endpoint's last /metrics scrape succeeded, else 0.",
            "endpoint",
        )
        self.acceptance = gauge(
            metrics.ENGINE_ACCEPTANCE_RATIO,
            "Accepted / drafted tokens over the last scrape interval that had drafts.",
        )
        self.length = gauge(
            metrics.ENGINE_MEAN_ACCEPTANCE_LENGTH,
            "Tokens emitted per speculative step: 1 + accepted / drafts.",
        )
        self.position = gauge(
            metrics.ENGINE_POSITION_ACCEPTANCE_RATIO,
            "Share of drafts whose token at this position was accepted.",
            "position",
        )
        self.running = gauge(metrics.ENGINE_REQUESTS_RUNNING, "Requests in the engine's batch.")
        self.waiting = gauge(metrics.ENGINE_REQUESTS_WAITING, "Requests queued in the engine.")
        self.kv_cache = gauge(metrics.ENGINE_KV_CACHE_USAGE, "KV-cache usage, 0..1 (engine mean).")
        self.generation_tokens = CounterMetricFamily(
            metrics.ENGINE_GENERATION_TOKENS,
            "The engine's own generated-tokens counter (vllm:generation_tokens_total), summed"
            " over its data-parallel engines, per endpoint; it resets when the engine restarts.",
            labels=["arm", "endpoint"],
        )
        self.restarts = CounterMetricFamily(
            metrics.ENGINE_RESTARTS, "Engine restarts detected by the scraper.", labels=["arm"]
        )

    def all(self) -> list[Metric]:
        return [
            self.up,
            self.acceptance,
            self.length,
            self.position,
            self.running,
            self.waiting,
            self.kv_cache,
            self.generation_tokens,
            self.restarts,
        ]


def register_engine_collector(
    registry: CollectorRegistry, states: Mapping[Arm, ArmState]
) -> EngineCollector:
    """Create the collector for `states` (an `EngineScraper.states`) on `registry`."""
    collector = EngineCollector(states)
    registry.register(collector)
    return collector
