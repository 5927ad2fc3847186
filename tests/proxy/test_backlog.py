"""`Backlog`: every finished call is recorded exactly once, in order, by the first of the next
call's engine wait, its deadline and a read; never lost, even when one of them fails."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from specproxy.config import Config, RoutingConfig, TelemetryConfig
from specproxy.metrics import REQUESTS, ProxyMetrics
from specproxy.proxy import backlog as backlog_module
from specproxy.proxy.backlog import Backlog
from specproxy.proxy.lifecycle import Forwarder
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.proxy.trace import Trace
from specproxy.proxy.transports.mock import Handler, MockReply, MockRequest, MockTransport
from specproxy.proxy.transports.select import Mode
from specproxy.records import EngineSample, Recorder, RequestRecord
from tests.proxy.conftest import CHAT, chat

HOUR = 3600.0  # a deadline no test waits for


def trace(request_id: str) -> Trace:
    return Trace(
        request_id=request_id,
        arm="speculative",
        endpoint="chat.completions",
        model="m",
        stream=True,
        pair_id=None,
        shadow=False,
        received=0.0,
        t_start=0.0,
    )


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Settled:
    """The `settle_one` under test: what was settled, with the moment each call ended."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []
        self.any = asyncio.Event()

    def __call__(self, t: Trace, ended: float) -> None:
        self.calls.append((t.request_id, ended))
        self.any.set()

    @property
    def ids(self) -> list[str]:
        return [request_id for request_id, _ in self.calls]


async def test_a_finished_call_waits_for_a_read_and_keeps_its_end_and_order() -> None:
    settled, clock = Settled(), Clock()
    backlog = Backlog(settled, deadline_s=HOUR, clock=clock)
    for i, at in enumerate((1.0, 2.0, 3.0)):
        clock.now = at
        backlog.add(trace(f"r{i}"))
    assert settled.calls == [] and len(backlog) == 3
    backlog.settle()
    assert settled.calls == [("r0", 1.0), ("r1", 2.0), ("r2", 3.0)]
    backlog.settle()  # each call once
    assert len(settled.calls) == 3 and len(backlog) == 0
    backlog.close()


async def test_the_next_calls_engine_wait_settles_in_the_loops_next_turn() -> None:
    settled = Settled()
    backlog = Backlog(settled, deadline_s=HOUR)
    backlog.soon()  # nothing waiting: nothing scheduled
    backlog.add(trace("r0"))
    backlog.soon()
    backlog.soon()  # one turn scheduled, however many calls go upstream meanwhile
    assert settled.ids == []  # not while the call that went upstream still runs
    await asyncio.sleep(0)
    assert settled.ids == ["r0"]
    backlog.close()


async def test_the_deadline_settles_with_no_reader_and_no_next_call() -> None:
    settled, clock = Settled(), Clock()
    backlog = Backlog(settled, deadline_s=0.001, clock=clock)
    backlog.add(trace("r0"))
    for _ in range(3):  # the timer fires on the loop's clock, sees a young call, waits again
        await asyncio.sleep(0.01)
    assert settled.ids == []
    clock.now = 1.0  # the call's deadline has passed on the request path's clock
    await asyncio.wait_for(settled.any.wait(), 60)
    assert settled.ids == ["r0"]
    backlog.close()


async def test_without_deferral_and_after_close_every_call_settles_at_once() -> None:
    settled = Settled()
    Backlog(settled, defer=False).add(trace("now"))
    assert settled.ids == ["now"]
    backlog = Backlog(settled, deadline_s=HOUR)
    backlog.add(trace("left"))
    backlog.close()
    assert settled.ids == ["now", "left"]
    backlog.add(trace("late"))  # a call still running at shutdown
    assert settled.ids == ["now", "left", "late"]


async def test_a_call_that_cannot_be_recorded_loses_none_behind_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    seen: list[str] = []

    def settle_one(t: Trace, ended: float) -> None:
        if t.request_id == "bad":
            raise RuntimeError("a bug")
        seen.append(t.request_id)

    backlog = Backlog(settle_one, deadline_s=HOUR)
    for request_id in ("r0", "bad", "r2"):
        backlog.add(trace(request_id))
    with caplog.at_level(logging.ERROR, logger="specproxy.proxy.backlog"):
        backlog.settle()
    assert seen == ["r0", "r2"]
    assert "could not record request bad" in caplog.text
    backlog.close()


async def test_a_read_from_another_thread_leaves_the_calls_to_the_loop() -> None:
    settled = Settled()
    backlog = Backlog(settled, deadline_s=HOUR)
    backlog.add(trace("r0"))
    await asyncio.to_thread(backlog.settle)  # e.g. a collect in a worker thread
    assert settled.ids == [] and len(backlog) == 1
    backlog.settle()
    assert settled.ids == ["r0"]
    backlog.close()


async def test_a_read_while_settling_settles_each_call_once() -> None:
    """A reader inside `settle_one` (a recorder whose write reads, a collect) is no double."""
    seen: list[str] = []

    def settle_one(t: Trace, ended: float) -> None:
        seen.append(t.request_id)
        backlog.settle()

    backlog = Backlog(settle_one, deadline_s=HOUR)
    backlog.add(trace("r0"))
    backlog.add(trace("r1"))
    backlog.settle()
    assert seen == ["r0", "r1"]
    backlog.close()


# --------------------------------------------------------------------------- in the forwarder

SSE = {"Content-Type": "text/event-stream"}
EVENTS = [
    b'data: {"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":"stop"}]}\n\n',
    b"data: [DONE]\n\n",
]


class PlainRecorder:
    """A `Recorder` with no read barrier: it sees a record only once the backlog settles it."""

    def __init__(self) -> None:
        self.records: list[RequestRecord] = []

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    def record_engine(self, sample: EngineSample) -> None:
        pass


async def serve(
    aiohttp_client: AiohttpClient, recorder: Recorder, handler: Handler, **cfg: Any
) -> tuple[TestClient[web.Request, web.Application], Forwarder, CollectorRegistry]:
    config = Config(
        baseline_url="http://baseline.invalid:8000",
        speculative_url="http://speculative.invalid:8000",
        routing=RoutingConfig(speculative_share=1.0),
        **cfg,
    )
    registry = CollectorRegistry()
    mock = MockTransport(handler)
    forwarder = Forwarder(
        config,
        sessions={},
        recorder=recorder,
        metrics=ProxyMetrics(registry),
        transports=lambda arm, url: dict.fromkeys(Mode, mock),
    )
    app = web.Application()
    app.router.add_post(CHAT, forwarder.measured)
    return await aiohttp_client(app), forwarder, registry


async def ask(client: TestClient[web.Request, web.Application]) -> str:
    async with client.post(CHAT, json=chat(stream=True)) as resp:
        await resp.read()
        assert resp.status == 200
        return resp.headers["x-specproxy-request-id"]


@pytest.fixture
def no_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backlog_module, "DEADLINE_S", HOUR)


@pytest.mark.usefixtures("no_deadline")
async def test_the_proxy_records_each_call_while_the_next_one_waits_for_its_engine(
    aiohttp_client: AiohttpClient,
) -> None:
    recorder = PlainRecorder()
    seen_while_waiting: list[int] = []

    async def engine(request: MockRequest) -> MockReply:
        await asyncio.sleep(0)  # the engine works for a turn of the loop
        seen_while_waiting.append(len(recorder.records))
        return MockReply(200, SSE, EVENTS)

    client, forwarder, _ = await serve(aiohttp_client, recorder, engine)
    ids = [await ask(client) for _ in range(3)]
    assert seen_while_waiting == [0, 1, 2]  # the calls before, each made in the next one's wait
    assert len(recorder.records) == 2  # the last waits for a read, its deadline or shutdown
    await forwarder.close()
    assert [rec.request_id for rec in recorder.records] == ids
    assert all(rec.error_kind is None and rec.n_events == 1 for rec in recorder.records)


@pytest.mark.usefixtures("no_deadline")
async def test_readers_see_every_call_already_over(aiohttp_client: AiohttpClient) -> None:
    """The memory recorder's `records` and a Prometheus collect are read barriers."""
    recorder = MemoryRecorder()
    client, forwarder, registry = await serve(
        aiohttp_client, recorder, lambda request: MockReply(200, SSE, EVENTS)
    )
    request_id = await ask(client)
    labels = {"arm": "speculative", "status": "200", "model": "other"}
    assert registry.get_sample_value(REQUESTS + "_total", labels) == 1
    assert [rec.request_id for rec in recorder.records] == [request_id]
    await forwarder.close()


@pytest.mark.usefixtures("no_deadline")
async def test_with_an_access_log_each_call_is_recorded_as_it_ends(
    aiohttp_client: AiohttpClient,
) -> None:
    recorder = PlainRecorder()
    client, forwarder, _ = await serve(
        aiohttp_client,
        recorder,
        lambda request: MockReply(200, SSE, EVENTS),
        telemetry=TelemetryConfig(access_log=True),
    )
    request_id = await ask(client)
    assert [rec.request_id for rec in recorder.records] == [request_id]
    await forwarder.close()
