"""The proxy's live Prometheus observations of finished records, and its in-flight gauges.

Labelled children are cached per label set (`.labels()` takes a lock and builds a tuple) and
observed through `metrics.fast_observe`/`fast_increment` (a request's gaps in one call,
`fast_observe_many`); in-flight counts are plain ints read at scrape time, so the request path
takes no lock.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias

from specproxy.fleet.models import OTHER
from specproxy.metrics import (
    UPSTREAM_ERROR_KINDS,
    ProxyMetrics,
    fast_increment,
    fast_observe,
    fast_observe_many,
)
from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm, RequestRecord

__all__ = ["Observer"]

_Observe: TypeAlias = Callable[[float], None]
# duration, ttft, tpot, the gaps (all of a request's at once), tokens per event, output tokens,
# overhead, acceptance length
_Children: TypeAlias = tuple[
    _Observe,
    _Observe,
    _Observe,
    Callable[[Iterable[float]], None],
    _Observe,
    _Observe,
    _Observe,
    _Observe,
]


class Observer:
    """Turns records into samples of the proxy's metrics; counts requests in flight per arm.

    The `model` label is the record's model through `model_label` (bounded: the served and
    allowed models, else "other"), so the cached children are bounded too.
    """

    def __init__(
        self,
        metrics: ProxyMetrics,
        model_label: Callable[[str], str] = lambda _: OTHER,
        arms: Iterable[Arm] = (SHORTHAND_TREATMENT, SHORTHAND_CONTROL),
    ) -> None:
        self._metrics = metrics
        self._label = model_label
        self._children: dict[tuple[Arm, str, bool, str], _Children] = {}
        self._request_counters: dict[tuple[Arm, int, str], Callable[[], None]] = {}
        self.inflight = dict.fromkeys(arms, 0)
        for arm in self.inflight:
            metrics.inflight.labels(arm).set_function(functools.partial(self._inflight_of, arm))

    def _inflight_of(self, arm: Arm) -> float:
        return float(self.inflight[arm])

    def rejected(self, reason: str) -> None:
        """The proxy answered a request itself (a `limits.Rejection`)."""
        self._metrics.rejected.labels(reason).inc()

    def shadow_skipped(self) -> None:
        self._metrics.shadow_skipped.inc()

    def observe(self, rec: RequestRecord, gaps: Sequence[float]) -> None:
        """One finished record: shadows count only their errors, primaries everything."""
        model = self._label(rec.model)
        if rec.shadow:
            if rec.error_kind in UPSTREAM_ERROR_KINDS:
                self._metrics.upstream_errors.labels(rec.arm, rec.error_kind, model).inc()
            return
        arm = rec.arm
        count = self._request_counters.get((arm, rec.status, model))
        if count is None:
            count = self._request_counters[(arm, rec.status, model)] = fast_increment(
                self._metrics.requests.labels(arm, str(rec.status), model)
            )
        count()
        kind = rec.error_kind
        if kind is not None:
            if kind in UPSTREAM_ERROR_KINDS:
                self._metrics.upstream_errors.labels(arm, kind, model).inc()
            return
        if rec.rerouted_from is not None:  # failed open: no latency sample of either arm
            return
        key = (arm, rec.endpoint, rec.stream, model)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = self._observers(key)
        duration, ttft, tpot, gaps_of, per_event, out, overhead, acceptance = children
        e2e = rec.e2e_s
        duration(e2e)
        overhead(e2e - rec.upstream_s if e2e > rec.upstream_s else 0.0)
        if rec.ttft_s is not None:
            ttft(rec.ttft_s)
        if rec.tpot_s is not None:
            tpot(rec.tpot_s)
        if rec.tokens_per_event is not None:
            per_event(rec.tokens_per_event)
        if rec.output_tokens is not None:
            out(rec.output_tokens)
        if rec.mean_acceptance_length is not None:
            acceptance(rec.mean_acceptance_length)
        if gaps:
            gaps_of(gaps)  # one call for all of them

    def _observers(self, key: tuple[Arm, str, bool, str]) -> _Children:
        """The histogram children of one (arm, endpoint, stream, model), as fast callables."""
        m = self._metrics
        arm, endpoint, stream, model = key
        return (
            fast_observe(
                m.request_duration.labels(arm, endpoint, "true" if stream else "false", model)
            ),
            fast_observe(m.ttft.labels(arm, endpoint, model)),
            fast_observe(m.tpot.labels(arm, endpoint, model)),
            fast_observe_many(m.event_gap.labels(arm, model)),
            fast_observe(m.tokens_per_event.labels(arm, model)),
            fast_observe(m.output_tokens.labels(arm, model)),
            fast_observe(m.proxy_overhead.labels(arm, model)),
            fast_observe(m.request_acceptance_length.labels(arm, model)),
        )
