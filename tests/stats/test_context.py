"""The stats job wired into the proxy app: traffic in, /api/stats and the speedup gauges out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry

from specproxy.app import create_app
from specproxy.config import Config, ScrapeConfig, StatsConfig, StoreConfig
from specproxy.emulator import EmulatorConfig, run_emulator
from specproxy.proxy.recorder import MemoryRecorder


@pytest.fixture
async def proxy() -> AsyncIterator[
    tuple[TestClient[web.Request, web.Application], CollectorRegistry]
]:
    fast = {"base_step_s": 0.002, "warmup_requests": 0, "seed": 1}
    async with (
        run_emulator(EmulatorConfig(speculative=True, **fast)) as spec_url,  # type: ignore[arg-type]
        run_emulator(EmulatorConfig(**fast)) as base_url,  # type: ignore[arg-type]
    ):
        cfg = Config(
            baseline_url=base_url,
            speculative_url=spec_url,
            store=StoreConfig(url="memory://", flush_interval_s=0.05),
            scrape=ScrapeConfig(interval_s=0.2),
            stats=StatsConfig(interval_s=0.2, resamples=200, warmup_requests=0),
        )
        registry = CollectorRegistry()
        client: TestClient[web.Request, web.Application] = TestClient(
            TestServer(create_app(cfg, registry=registry))
        )
        await client.start_server()
        try:
            yield client, registry
        finally:
            await client.close()


async def test_api_stats_reflects_recorded_traffic(
    proxy: tuple[TestClient[web.Request, web.Application], CollectorRegistry],
) -> None:
    client, registry = proxy
    body = {"model": "tiny-llama", "prompt": "count to ten", "max_tokens": 24}
    for _ in range(30):
        resp = await client.post("/v1/completions", json=body)
        assert resp.status == 200
        await resp.read()

    async with asyncio.timeout(30):
        while True:
            resp = await client.get("/api/stats")
            if resp.status == 200:
                result = await resp.json()
                window = result["results"]["all"]["all"]
                if sum(window["samples"].values()) >= 30:
                    break
            await asyncio.sleep(0.1)

    assert window["samples"]["speculative"] + window["samples"]["baseline"] == 30
    speedup = window["metrics"]["e2e"]["speedup"]["median"]
    assert speedup["status"] == "ok"
    assert speedup["lower"] <= speedup["estimate"] <= speedup["upper"]
    gauge = registry.get_sample_value(
        "specproxy_speedup_ratio",
        {
            "model": "all",
            "window": "all",
            "metric": "e2e",
            "statistic": "median",
            "bound": "estimate",
        },
    )
    assert gauge is not None and gauge > 0


async def test_no_store_means_no_job_and_a_clear_503() -> None:
    cfg = Config(baseline_url="http://127.0.0.1:9", speculative_url="http://127.0.0.1:9")
    app = create_app(cfg, recorder=MemoryRecorder(), with_store=False, with_stats=False)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/api/stats")
        assert resp.status == 503
        error = (await resp.json())["error"]
        assert error["code"] == 503 and "not running" in error["message"]
