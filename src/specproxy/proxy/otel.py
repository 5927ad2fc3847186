"""OpenTelemetry spans of measured requests, exported over OTLP/HTTP (the `otel` extra).

Imported only by `tracing.open_tracing`, when `[telemetry] otlp_traces_endpoint` is set. The
tracer provider is this module's own (the process-global one is left alone); spans are batched
and exported by the SDK's worker thread, off the event loop. Attribute names follow the
OpenTelemetry HTTP and GenAI semantic conventions where one exists (`http.request.method`,
`http.route`, `http.response.status_code`, `error.type`, `gen_ai.request.model`,
`server.address`); the arm and the request id are `specproxy.*`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from specproxy.config import TelemetryConfig

if TYPE_CHECKING:
    from specproxy.proxy.trace import Trace
    from specproxy.records import RequestRecord

__all__ = ["EXPORT_TIMEOUT_S", "OtelTracing"]

EXPORT_TIMEOUT_S = 5.0  # one export to the collector; a dead collector costs spans, not requests
_PATHS = {"chat.completions": "/v1/chat/completions", "completions": "/v1/completions"}
_PROPAGATOR = TraceContextTextMapPropagator()


class OtelTracing:
    """`tracing.Tracing` on the OpenTelemetry SDK."""

    def __init__(self, cfg: TelemetryConfig, *, exporter: Any = None) -> None:
        self._provider = TracerProvider(
            resource=Resource.create({"service.name": cfg.service_name})
        )
        if exporter is None:
            exporter = OTLPSpanExporter(endpoint=cfg.otlp_traces_endpoint, timeout=EXPORT_TIMEOUT_S)
        self._provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self._provider.get_tracer("specproxy")

    def start(self, headers: Mapping[str, str], trace: Trace) -> _Spans:
        parent = _PROPAGATOR.extract(headers)
        path = _PATHS.get(trace.endpoint, trace.endpoint)
        span = self._tracer.start_span(
            f"POST {path}",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=int(trace.t_start * 1e9),
            attributes={
                "http.request.method": "POST",
                "http.route": path,
                "url.path": path,
                "gen_ai.request.model": trace.model,
                "specproxy.request_id": trace.request_id,
                "specproxy.endpoint": trace.endpoint,
                "specproxy.stream": trace.stream,
            },
        )
        return _Spans(self._tracer, span)

    def close(self) -> None:
        self._provider.shutdown()


class _Spans:
    __slots__ = ("_client", "_server", "_tracer")

    def __init__(self, tracer: Any, server: Span) -> None:
        self._tracer = tracer
        self._server = server
        self._client: Span | None = None

    def upstream_start(self, trace: Trace) -> Sequence[tuple[str, str]]:
        self._client = client = self._tracer.start_span(
            "POST",
            context=set_span_in_context(self._server, Context()),
            kind=SpanKind.CLIENT,
            attributes={"http.request.method": "POST", "specproxy.arm": trace.arm},
        )
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=set_span_in_context(client, Context()))
        return tuple(carrier.items())

    def upstream_end(self, trace: Trace) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        if trace.engine_url is not None:
            parts = urlsplit(trace.engine_url)
            client.set_attribute("server.address", parts.hostname or "")
            if parts.port is not None:
                client.set_attribute("server.port", parts.port)
            client.set_attribute("url.full", trace.engine_url + _PATHS.get(trace.endpoint, ""))
        client.set_attribute("specproxy.arm", trace.arm)
        _outcome(client, trace.status, trace.error_kind)
        client.end()

    def end(self, trace: Trace, record: RequestRecord | None) -> None:
        span = self._server
        span.set_attribute("specproxy.arm", trace.arm)
        if trace.rerouted_from is not None:
            span.set_attribute("specproxy.rerouted_from", trace.rerouted_from)
        if record is not None:
            span.set_attribute("specproxy.e2e_s", record.e2e_s)
            if record.ttft_s is not None:
                span.set_attribute("specproxy.ttft_s", record.ttft_s)
            if record.output_tokens is not None:
                span.set_attribute("gen_ai.usage.output_tokens", record.output_tokens)
        _outcome(span, trace.status, trace.error_kind)
        span.end()


def _outcome(span: Span, status: int, error_kind: Any) -> None:
    if status:
        span.set_attribute("http.response.status_code", status)
    if error_kind is not None:
        span.set_attribute("error.type", str(error_kind))
        span.set_status(Status(StatusCode.ERROR))
