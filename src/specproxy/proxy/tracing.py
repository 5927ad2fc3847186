"""The proxy's hooks for distributed traces, with no OpenTelemetry in them.

`Forwarder` calls them at the boundaries of a measured request only, never per streamed event:
`Tracing.start` when the request is routed (the server span, a child of the client's
`traceparent` when it sent one), `RequestSpans.upstream_start` right before the upstream call
(the client span; the headers it returns carry that span's `traceparent` upstream, replacing the
client's, so the engine's own spans are its children), `upstream_end` once the upstream answer
is over, and `end` with the request's record. `open_tracing` returns None when traces are off
(`[telemetry] otlp_traces_endpoint` unset): then nothing of OpenTelemetry is imported, and the
request path pays one `is None` test. The implementation is `proxy.otel`, imported only here and
only when traces are on (`pip install 'specproxy[otel]'`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from specproxy.config import TelemetryConfig
from specproxy.extras import require

if TYPE_CHECKING:
    from specproxy.proxy.trace import Trace
    from specproxy.records import RequestRecord

__all__ = ["RequestSpans", "Tracing", "open_tracing"]


class RequestSpans(Protocol):
    """The spans of one measured request."""

    def upstream_start(self, trace: Trace) -> Sequence[tuple[str, str]]:
        """Start the client span; the headers that propagate it upstream."""
        ...

    def upstream_end(self, trace: Trace) -> None:
        """End the client span (no-op if it never started)."""
        ...

    def end(self, trace: Trace, record: RequestRecord | None) -> None:
        """End the server span with what the request became."""
        ...


class Tracing(Protocol):
    """Makes the spans of each request and exports them."""

    def start(self, headers: Mapping[str, str], trace: Trace) -> RequestSpans:
        """The server span of a request with these client headers."""
        ...

    def close(self) -> None:
        """Export what is left and stop (blocking: call it off the event loop)."""
        ...


def open_tracing(cfg: TelemetryConfig) -> Tracing | None:
    """The configured tracing, or None when traces are off."""
    if cfg.otlp_traces_endpoint is None:
        return None
    require("opentelemetry.sdk", "telemetry.otlp_traces_endpoint")
    from specproxy.proxy.otel import OtelTracing

    return OtelTracing(cfg)
