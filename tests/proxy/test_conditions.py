"""The conditions each record carries: temperature, category, calls in flight, engine load."""

from __future__ import annotations

import asyncio
import json

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import SCRAPER
from specproxy.config import Config, RoutingConfig, SegmentsConfig
from specproxy.errors import ConfigError
from specproxy.proxy.conditions import CATEGORY_MAX_CHARS, OTHER, Categories, temperature_of
from specproxy.proxy.recorder import MemoryRecorder
from tests.proxy.conftest import CHAT, chat

COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
    "usage": {"prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7},
}


def test_temperature_is_a_finite_number_at_least_zero_else_none() -> None:
    assert temperature_of({"temperature": 0}) == 0.0
    assert temperature_of({"temperature": 0.7}) == 0.7
    assert temperature_of({"temperature": 2}) == 2.0
    for bad in (None, True, "0.5", -0.1, float("nan"), float("inf"), [1]):
        assert temperature_of({"temperature": bad}) is None
    assert temperature_of({}) is None  # the engine's default: recorded as not given


def test_categories_are_bounded_in_charset_length_and_count() -> None:
    cats = Categories(limit=2)
    assert cats.of(None) is None
    assert cats.of(" Code ") == "code"  # case folded, trimmed
    assert cats.of("chat") == "chat"
    assert cats.of("math") == OTHER  # a third distinct value: over the limit
    assert cats.of("code") == "code"  # kept ones stay
    assert cats.of("x" * CATEGORY_MAX_CHARS) == OTHER  # limit reached; length checked below
    fresh = Categories(limit=16)
    assert fresh.of("x" * CATEGORY_MAX_CHARS) == "x" * CATEGORY_MAX_CHARS
    assert fresh.of("x" * (CATEGORY_MAX_CHARS + 1)) == OTHER
    for bad in ("", "a b", "ünï", "a/b", "a\x00"):
        assert fresh.of(bad) == OTHER
    assert fresh.kept == {"x" * CATEGORY_MAX_CHARS}


def test_segments_config_validates_its_header_and_bound() -> None:
    assert (
        Config.from_mapping(
            {"baseline_url": "http://b:1", "speculative_url": "http://s:1"}
        ).segments
        == SegmentsConfig()
    )
    with pytest.raises(ConfigError, match=r"segments\.category_header"):
        SegmentsConfig(category_header="x y")
    with pytest.raises(ConfigError, match=r"segments\.categories_max"):
        SegmentsConfig(categories_max=0)


async def test_records_carry_the_conditions_of_their_requests(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    """Three requests held by the engine until all three arrived: each saw the ones before it
    in flight to its arm and endpoint (itself included), so the counts are 1, 2 and 3."""
    arrived: list[web.Request] = []
    release = asyncio.Event()

    async def generate(request: web.Request) -> web.Response:
        arrived.append(request)
        if len(arrived) == 3:
            release.set()
        await release.wait()
        return web.json_response(COMPLETION)

    engine = web.Application()
    engine.router.add_post(CHAT, generate)
    server = await aiohttp_server(engine)
    url = str(server.make_url("")).rstrip("/")
    cfg = Config(
        baseline_url=url,
        speculative_url=url,
        routing=RoutingConfig(speculative_share=1.0),
        segments=SegmentsConfig(category_header="x-task"),
    )
    recorder = MemoryRecorder()
    app = create_app(
        cfg, registry=CollectorRegistry(), recorder=recorder, with_store=False, with_stats=False
    )
    client: TestClient = await aiohttp_client(await aiohttp_server(app))  # type: ignore[type-arg]

    async def send(i: int) -> None:
        body = chat(stream=False, temperature=[0.0, 0.7, None][i])
        headers = {"x-task": ["code", "Chat", "no way"][i]}
        async with client.post(CHAT, data=json.dumps(body), headers=headers) as resp:
            assert resp.status == 200
            await resp.read()

    async with asyncio.timeout(30):
        await asyncio.gather(*(send(i) for i in range(3)))
    records = sorted(recorder.records, key=lambda r: r.arm_in_flight or 0)
    assert [r.arm_in_flight for r in records] == [1, 2, 3]
    assert [r.endpoint_in_flight for r in records] == [1, 2, 3]
    by_category = {r.category: r.temperature for r in records}
    assert by_category == {"code": 0.0, "chat": 0.7, OTHER: None}
    # no /metrics on this engine: its load is unknown, never a made-up zero
    assert all(r.engine_running is None and r.engine_waiting is None for r in records)


async def test_records_carry_the_engine_load_of_the_endpoint_s_latest_scrape(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    """The app wires the scraper's memory into the request path: a request sent after a scrape
    that read 7 running and 2 waiting on its endpoint records them; after the next scrape (5
    and 0) the next request records those."""
    gauges = {"running": 7, "waiting": 2}

    async def metrics(request: web.Request) -> web.Response:
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="m"}} {gauges["running"]}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="m"}} {gauges["waiting"]}\n'
        )
        return web.Response(text=text, content_type="text/plain")

    async def generate(request: web.Request) -> web.Response:
        return web.json_response(COMPLETION)

    engine = web.Application()
    engine.router.add_post(CHAT, generate)
    engine.router.add_get("/metrics", metrics)
    url = str((await aiohttp_server(engine)).make_url("")).rstrip("/")
    cfg = Config(
        baseline_url=url, speculative_url=url, routing=RoutingConfig(speculative_share=1.0)
    )
    recorder = MemoryRecorder()
    app = create_app(
        cfg, registry=CollectorRegistry(), recorder=recorder, with_store=False, with_stats=False
    )
    client: TestClient = await aiohttp_client(await aiohttp_server(app))  # type: ignore[type-arg]
    scraper = app[SCRAPER]

    async def send() -> None:
        body = json.dumps(chat(stream=False))
        async with client.post(CHAT, data=body) as resp:
            assert resp.status == 200
            await resp.read()

    async with asyncio.timeout(30):
        await scraper.scrape_once()
        await send()
        gauges.update(running=5, waiting=0)
        await scraper.scrape_once()
        await send()
    loads = [(r.engine_running, r.engine_waiting) for r in recorder.records]
    assert loads == [(7.0, 2.0), (5.0, 0.0)]
