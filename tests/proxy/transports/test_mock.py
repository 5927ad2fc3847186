"""`MockTransport` as the seam under the proxy: primary and shadow calls take one path, with one
error mapping, whatever the engine does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from specproxy.config import ArmConfig, Config, OnDown, RoutingConfig
from specproxy.errors import UpstreamBroken, UpstreamConnectError, UpstreamTimeout
from specproxy.metrics import ProxyMetrics
from specproxy.proxy.lifecycle import Forwarder
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.proxy.transports.mock import Handler, MockReply, MockRequest, MockTransport
from specproxy.proxy.transports.select import Mode
from specproxy.records import Arm, RequestRecord
from tests.proxy.conftest import CHAT, chat

SSE = {"Content-Type": "text/event-stream"}
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}\n\n',
    b'data: {"choices":[{"index":0,"delta":{"content":"b"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


@dataclass
class Rig:
    client: TestClient[web.Request, web.Application]
    recorder: MemoryRecorder
    forwarder: Forwarder
    mocks: dict[Arm, MockTransport]

    async def records(self, n: int) -> list[RequestRecord]:
        """The first `n` records, once the shadows wrote theirs."""
        await self.forwarder.close()  # waits for (cancels) running shadows
        return list(self.recorder.records)[:n]


class MakeRig(Protocol):
    async def __call__(
        self,
        speculative: Handler,
        baseline: Handler,
        *,
        mirror_fraction: float = 0.0,
        on_down: OnDown = "control",
    ) -> Rig: ...


@pytest.fixture
async def rig(aiohttp_client: AiohttpClient) -> AsyncIterator[MakeRig]:
    forwarders: list[Forwarder] = []

    async def make(
        speculative: Handler,
        baseline: Handler,
        *,
        mirror_fraction: float = 0.0,
        on_down: OnDown = "control",
    ) -> Rig:
        cfg = Config(
            baseline_url="http://baseline.invalid:8000",
            speculative_url="http://speculative.invalid:8000",
            routing=RoutingConfig(speculative_share=1.0, mirror_fraction=mirror_fraction),
            speculative=ArmConfig(on_down=on_down),
        )
        mocks = {"speculative": MockTransport(speculative), "baseline": MockTransport(baseline)}
        recorder = MemoryRecorder()
        forwarder = Forwarder(
            cfg,
            sessions={},
            recorder=recorder,
            metrics=ProxyMetrics(CollectorRegistry()),
            transports=lambda arm, url: dict.fromkeys(Mode, mocks[arm]),
        )
        forwarders.append(forwarder)
        app = web.Application()
        app.router.add_post(CHAT, forwarder.measured)
        client: TestClient[web.Request, web.Application] = await aiohttp_client(app)
        return Rig(client, recorder, forwarder, mocks)

    yield make
    for forwarder in forwarders:
        await forwarder.close()


def ok(request: MockRequest) -> MockReply:
    return MockReply(200, SSE, EVENTS)


async def test_requests_reach_the_transport_as_the_client_sent_them(
    rig: MakeRig,
) -> None:
    r = await rig(ok, ok)
    async with r.client.post(CHAT, json=chat(stream=True), headers={"X-Tenant": "t1"}) as resp:
        assert await resp.read() == b"".join(EVENTS)
    (sent,) = r.mocks["speculative"].requests
    assert (sent.method, sent.target) == ("POST", CHAT)
    assert sent.headers["X-Tenant"] == "t1" and "Host" not in sent.headers
    assert b'"include_usage":true' in (sent.body or b"")  # asked for on the client's behalf
    assert not r.mocks["baseline"].requests


@pytest.mark.parametrize(
    ("failure", "kind", "status"),
    [
        (UpstreamConnectError("refused"), "connect", 502),
        (UpstreamTimeout("silent"), "timeout", 504),
        (UpstreamBroken("garbage"), "broken", 502),
    ],
)
async def test_a_failure_before_the_headers_is_recorded_alike_for_primary_and_shadow(
    rig: MakeRig, failure: Exception, kind: str, status: int
) -> None:
    def fails(request: MockRequest) -> MockReply:
        raise failure

    r = await rig(fails, fails, mirror_fraction=1.0, on_down="error")  # no failing open
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        assert resp.status == status
        error = (await resp.json())["error"]
        assert error["code"] == status and error["message"].startswith("the speculative arm ")
    primary, shadow = sorted(await r.records(2), key=lambda rec: rec.shadow)
    assert (primary.arm, shadow.arm) == ("speculative", "baseline") and shadow.shadow
    for rec in (primary, shadow):
        assert (rec.error_kind, rec.status) == (kind, status)
        assert rec.engine_url is not None and rec.n_events == 0


@pytest.mark.parametrize(
    ("failure", "status"), [(UpstreamTimeout("silent"), 504), (UpstreamBroken("garbage"), 502)]
)
async def test_only_a_call_never_sent_fails_open(
    rig: MakeRig, failure: Exception, status: int
) -> None:
    """Refused: the control serves it (sent once, to the control). Timed out or broken after
    sending: the client gets the treatment's error, and the control never sees the request."""

    def refused(request: MockRequest) -> MockReply:
        raise UpstreamConnectError("refused")

    def fails(request: MockRequest) -> MockReply:
        raise failure

    r = await rig(refused, ok)
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        assert resp.status == 200 and resp.headers["x-specproxy-arm"] == "baseline"
        assert await resp.read() == b"".join(EVENTS)
    (rec,) = await r.records(1)
    assert (rec.arm, rec.rerouted_from, rec.reroute_reason) == (
        "baseline",
        "speculative",
        "connect",
    )
    assert len(r.mocks["baseline"].requests) == 1

    r = await rig(fails, ok)
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        assert resp.status == status and resp.headers["x-specproxy-arm"] == "speculative"
    (rec,) = await r.records(1)
    assert rec.arm == "speculative" and rec.rerouted_from is None
    assert not r.mocks["baseline"].requests  # never sent twice


async def test_a_stream_cut_short_is_broken_for_primary_and_shadow(
    rig: MakeRig,
) -> None:
    def cut(request: MockRequest) -> MockReply:
        return MockReply(200, SSE, EVENTS[:1], error=UpstreamBroken("closed mid-body"))

    r = await rig(cut, cut, mirror_fraction=1.0)
    received = b""
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):  # cut off, as the proxy's upstream was
            async for chunk in resp.content.iter_any():
                received += chunk
    assert received == EVENTS[0]
    records = await r.records(2)
    assert len(records) == 2
    for rec in records:
        assert (rec.error_kind, rec.status, rec.n_events) == ("broken", 200, 1)
        assert rec.tpot_s is None


async def test_http_errors_pass_through_and_connections_are_kept_only_after_success(
    rig: MakeRig,
) -> None:
    replies: list[MockReply] = []

    def answer(request: MockRequest) -> MockReply:
        status = 200 if len(replies) % 2 == 0 else 503
        body = b'{"usage":{"completion_tokens":3}}' if status == 200 else b'{"error":"busy"}'
        replies.append(
            MockReply(
                status, {"Content-Type": "application/json"}, [body], content_length=len(body)
            )
        )
        return replies[-1]

    r = await rig(answer, answer)
    for expected in (200, 503):
        async with r.client.post(CHAT, json=chat()) as resp:
            assert resp.status == expected
            await resp.read()
    ok_rec, busy = await r.records(2)
    assert (ok_rec.error_kind, ok_rec.output_tokens) == (None, 3)
    assert (busy.error_kind, busy.status) == ("http_5xx", 503)
    assert [(m.released, m.closed) for m in replies] == [(True, False), (False, True)]


@pytest.mark.parametrize("pieces", [1, 3])
async def test_the_last_piece_goes_out_in_the_same_write_as_the_end(
    rig: MakeRig, monkeypatch: pytest.MonkeyPatch, pieces: int
) -> None:
    """A body whose end the transport knows (`Reply.at_eof`) is finished in the write that
    carries its last bytes: one send less per stream, and the client's last event is not
    held back for a separate terminator. A body cut short gets no terminator at all."""
    from aiohttp.http_writer import StreamWriter

    # By writer (the client's request writer is one too), each kept alive: keyed by `id`, a
    # writer freed after the request could lend its address, so its id, to the server's.
    writes: dict[StreamWriter, list[bytes]] = {}
    write, writelines = StreamWriter._write, StreamWriter._writelines

    def record_write(self: StreamWriter, chunk: bytes) -> None:
        write(self, chunk)  # raises, unsent, on a closed transport
        writes.setdefault(self, []).append(bytes(chunk))

    def record_writelines(self: StreamWriter, chunks: list[bytes]) -> None:
        chunks = [bytes(c) for c in chunks]
        writelines(self, chunks)
        writes.setdefault(self, []).append(b"".join(chunks))

    monkeypatch.setattr(StreamWriter, "_write", record_write)
    monkeypatch.setattr(StreamWriter, "_writelines", record_writelines)
    body = b"".join(EVENTS)
    split = [body] if pieces == 1 else EVENTS

    def answer(request: MockRequest) -> MockReply:
        return MockReply(200, SSE, split)

    r = await rig(answer, answer)
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        assert await resp.read() == body
    (sent,) = [w for w in writes.values() if w[0].startswith(b"HTTP/1.1 200")]
    assert sent[-1].endswith(EVENTS[-1] + b"\r\n0\r\n\r\n")  # the end rides with the last piece
    assert b"0\r\n\r\n" not in sent  # never a write of its own
    assert EVENTS[0] in sent[0]  # the headers ride with the first piece, already here
    if pieces == 1:
        assert len(sent) == 1
    (rec,) = await r.records(1)
    assert rec.error_kind is None and rec.n_events == 2

    writes.clear()

    def cut(request: MockRequest) -> MockReply:
        return MockReply(200, SSE, EVENTS[:2], error=UpstreamBroken("closed mid-body"))

    r = await rig(cut, cut)
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
    (sent,) = [w for w in writes.values() if w[0].startswith(b"HTTP/1.1 200")]
    assert len(sent) == 2 and not any(w.endswith(b"0\r\n\r\n") for w in sent)

    writes.clear()

    def partial(request: MockRequest) -> MockReply:  # no whole event in the first piece
        return MockReply(200, SSE, [EVENTS[0][:7], EVENTS[0][7:], *EVENTS[1:]])

    r = await rig(partial, partial)
    async with r.client.post(CHAT, json=chat(stream=True)) as resp:
        assert await resp.read() == body
    (sent,) = [w for w in writes.values() if w[0].startswith(b"HTTP/1.1 200")]
    assert sent[0].endswith(b"\r\n\r\n") and b"data:" not in sent[0]  # the headers, at once
