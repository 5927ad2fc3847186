"""Balancing within an arm: least outstanding over the pool, ejection, retry of unsent calls."""

from __future__ import annotations

from collections import Counter

from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import FLEET
from specproxy.config import Config, OutlierConfig, RoutingConfig
from specproxy.errors import ErrorKind
from specproxy.proxy.endpoints import verdict
from specproxy.proxy.recorder import MemoryRecorder
from tests.proxy.conftest import CHAT, chat
from tests.proxy.fake_upstream import FakeUpstream


def test_verdicts() -> None:
    assert verdict(None) is True
    assert verdict(ErrorKind.HTTP_4XX) is True  # the client's fault, not the engine's
    for kind in (ErrorKind.CONNECT, ErrorKind.TIMEOUT, ErrorKind.BROKEN, ErrorKind.HTTP_5XX):
        assert verdict(kind) is False
    assert verdict(ErrorKind.DISCONNECTED) is None and verdict(ErrorKind.CANCELLED) is None


async def test_arm_of_two_endpoints_balances_and_survives_one_dying(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    one, two, base = FakeUpstream("speculative"), FakeUpstream("speculative"), FakeUpstream("b")
    s1, s2, sb = [await aiohttp_server(f.app()) for f in (one, two, base)]
    url1, url2 = (str(s.make_url("")).rstrip("/") for s in (s1, s2))
    cfg = Config(
        baseline_url=str(sb.make_url("")),
        speculative=Config.from_mapping(
            {"speculative": {"urls": [url1, url2]}, "baseline_url": "http://x:1"}
        ).speculative,
        routing=RoutingConfig(speculative_share=1.0),
        outlier=OutlierConfig(eject_after_failures=2),
    )
    recorder = MemoryRecorder()
    app = create_app(
        cfg,
        registry=CollectorRegistry(),
        recorder=recorder,
        with_store=False,
        with_stats=False,
    )
    client: TestClient = await aiohttp_client(await aiohttp_server(app))  # type: ignore[type-arg]

    for i in range(10):
        resp = await client.post(CHAT, json=chat(stream=i % 2 == 0))
        assert resp.status == 200
        await resp.read()
    # One client at a time: every pick is a tie, broken round-robin.
    assert Counter(r.engine_url for r in recorder.records) == {url1: 5, url2: 5}

    def calls(fake: FakeUpstream) -> int:
        return sum(1 for seen in fake.seen if seen["path"] == CHAT)

    assert calls(one) == calls(two) == 5

    await s2.close()  # endpoint two dies: refused from now on
    async with client.get("/readyz") as resp:  # one live engine is enough for the arm
        assert resp.status == 200
        assert (await resp.json())["arms"]["speculative"] is True
    before = len(recorder.records)
    for i in range(10):
        resp = await client.post(CHAT, json=chat(stream=i % 2 == 0))
        assert resp.status == 200  # never sent to two: retried on one, the client sees no error
        await resp.read()
    after = list(recorder.records)[before:]
    assert {r.engine_url for r in after} == {url1}
    assert all(r.error_kind is None for r in after)
    pool = app[FLEET].pool("speculative")
    dead = next(ep for ep in pool.endpoints if ep.url == url2)
    assert dead.ejected  # two refused calls in a row
    assert all(ep.outstanding == 0 for ep in pool.endpoints)
    await client.close()
