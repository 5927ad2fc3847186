"""Traces over OTLP/HTTP, against an in-process receiver that decodes the protobuf: one server
span and one client span per measured request, in the client's trace, propagated upstream."""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from pytest_aiohttp import AiohttpServer

from specproxy.config import ArmConfig, TelemetryConfig
from specproxy.errors import ConfigError
from specproxy.proxy.tracing import open_tracing
from tests.proxy.conftest import CHAT, SPEC_ONLY, Arms, MakeProxy, chat

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"


@dataclass
class OtlpReceiver:
    """POST /v1/traces: an OTLP/HTTP collector that keeps every span it is sent."""

    spans: list[Span] = field(default_factory=list)
    services: list[str] = field(default_factory=list)
    content_types: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        return app

    async def _traces(self, request: web.Request) -> web.Response:
        self.content_types.append(request.content_type)
        export = ExportTraceServiceRequest.FromString(await request.read())
        for resource_spans in export.resource_spans:
            for attr in resource_spans.resource.attributes:
                if attr.key == "service.name":
                    self.services.append(attr.value.string_value)
            for scope in resource_spans.scope_spans:
                self.spans.extend(scope.spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(),
            content_type="application/x-protobuf",
        )


def attributes(span: Span) -> dict[str, object]:
    out: dict[str, object] = {}
    for attr in span.attributes:
        value = attr.value
        out[attr.key] = getattr(value, value.WhichOneof("value"))
    return out


@pytest.mark.parametrize("stream", [False, True])
async def test_each_request_is_a_server_and_a_client_span_in_the_clients_trace(
    arms: Arms, make_proxy: MakeProxy, aiohttp_server: AiohttpServer, stream: bool
) -> None:
    receiver = OtlpReceiver()
    collector = await aiohttp_server(receiver.app())
    telemetry = TelemetryConfig(otlp_traces_endpoint=str(collector.make_url("/v1/traces")))
    proxy = await make_proxy(routing=SPEC_ONLY, telemetry=telemetry)
    traceparent = f"00-{TRACE_ID}-{CLIENT_PARENT}-01"
    body = chat(stream=stream, model="tiny-llama")
    async with proxy.client.post(CHAT, json=body, headers={"traceparent": traceparent}) as resp:
        assert resp.status == 200
        await resp.read()
    upstream_traceparent = arms.speculative.seen[-1]["headers"]["traceparent"]
    await proxy.client.close()  # the app's shutdown exports the spans left
    assert receiver.content_types == ["application/x-protobuf"]
    assert receiver.services == ["specproxy"]
    servers = [s for s in receiver.spans if s.kind == Span.SPAN_KIND_SERVER]
    clients = [s for s in receiver.spans if s.kind == Span.SPAN_KIND_CLIENT]
    assert len(servers) == 1 and len(clients) == 1 and len(receiver.spans) == 2
    server, client = servers[0], clients[0]
    assert server.trace_id.hex() == client.trace_id.hex() == TRACE_ID
    assert server.parent_span_id.hex() == CLIENT_PARENT  # the client's span
    assert client.parent_span_id == server.span_id
    # the engine is sent the client span as its parent: vLLM's spans join under it
    assert upstream_traceparent == f"00-{TRACE_ID}-{client.span_id.hex()}-01"
    assert server.name == "POST /v1/chat/completions"
    server_attrs = attributes(server)
    assert server_attrs["specproxy.arm"] == "speculative"
    assert server_attrs["specproxy.endpoint"] == "chat.completions"
    assert server_attrs["gen_ai.request.model"] == "tiny-llama"
    assert server_attrs["http.response.status_code"] == 200
    assert "error.type" not in server_attrs
    assert server_attrs["specproxy.request_id"] == proxy.recorder.records[-1].request_id
    client_attrs = attributes(client)
    assert client_attrs["specproxy.arm"] == "speculative"
    assert client_attrs["server.address"] == "127.0.0.1"
    assert server.start_time_unix_nano <= client.start_time_unix_nano
    assert client.end_time_unix_nano <= server.end_time_unix_nano


async def test_a_refused_arm_is_an_error_span_without_a_client_traceparent(
    arms: Arms, make_proxy: MakeProxy, aiohttp_server: AiohttpServer
) -> None:
    receiver = OtlpReceiver()
    collector = await aiohttp_server(receiver.app())
    telemetry = TelemetryConfig(otlp_traces_endpoint=str(collector.make_url("/v1/traces")))
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proxy = await make_proxy(
        routing=SPEC_ONLY,
        telemetry=telemetry,
        speculative_url=dead,
        speculative=ArmConfig(on_down="error"),  # its errors reach the client
    )
    async with proxy.client.post(CHAT, json=chat()) as resp:
        assert resp.status == 502
        await resp.read()
    await proxy.client.close()
    (server,) = [s for s in receiver.spans if s.kind == Span.SPAN_KIND_SERVER]
    (client,) = [s for s in receiver.spans if s.kind == Span.SPAN_KIND_CLIENT]
    assert server.parent_span_id == b""  # a new trace: the client sent none
    attrs = attributes(server)
    assert attrs["http.response.status_code"] == 502
    assert attrs["error.type"] == "connect" == proxy.recorder.records[-1].error_kind
    assert server.status.code == server.status.STATUS_CODE_ERROR
    assert client.trace_id == server.trace_id


def test_traces_without_the_extra_name_it() -> None:
    sys.modules["opentelemetry.sdk"] = None  # type: ignore[assignment]
    try:
        with pytest.raises(ConfigError, match=r"pip install 'specproxy\[otel\]'"):
            open_tracing(TelemetryConfig(otlp_traces_endpoint="http://collector:4318/v1/traces"))
    finally:
        del sys.modules["opentelemetry.sdk"]
    assert open_tracing(TelemetryConfig()) is None
