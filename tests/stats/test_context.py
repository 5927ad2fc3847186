"""The stats job wired into the proxy app: traffic in, /api/stats and the speedup gauges out."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from specproxy.app import create_app
from specproxy.config import ArmConfig, Config, ScrapeConfig, StatsConfig, StoreConfig, WarmupConfig
from specproxy.emulator import EmulatorConfig, run_emulator
from specproxy.proxy.recorder import MemoryRecorder
from tests.scrape.fakes import FakeMetricsServer

DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"


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
            stats=StatsConfig(interval_s=0.2, resamples=200),
            warmup=WarmupConfig(requests=0),
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


async def test_gpu_telemetry_of_an_arm_reaches_api_stats(aiohttp_server: AiohttpServer) -> None:
    # The whole path inside the app: a fake dcgm-exporter on port 0 (derived hot page: DRAM
    # active 0.95, reasons sw_thermal|hw_thermal) for the speculative arm, the GPU scraper, the
    # stats job's window summary and diagnosis, served at /api/stats.
    exporter = FakeMetricsServer(body=(DCGM / "derived_h200_hot_saturated.prom").read_text())
    exporter_url = str((await aiohttp_server(exporter.app())).make_url(""))
    fast = {"base_step_s": 0.002, "warmup_requests": 0, "seed": 1}
    async with (
        run_emulator(EmulatorConfig(speculative=True, **fast)) as spec_url,  # type: ignore[arg-type]
        run_emulator(EmulatorConfig(**fast)) as base_url,  # type: ignore[arg-type]
    ):
        cfg = Config(
            baseline_url=base_url,
            speculative=ArmConfig(urls=(spec_url,), dcgm_urls=(exporter_url,)),
            store=StoreConfig(url="memory://", flush_interval_s=0.05),
            scrape=ScrapeConfig(interval_s=0.1),
            stats=StatsConfig(interval_s=0.2, resamples=200),
            warmup=WarmupConfig(requests=0),
        )
        async with TestClient(TestServer(create_app(cfg))) as client:
            body = {"model": "tiny-llama", "prompt": "count to ten", "max_tokens": 8}
            for _ in range(10):
                resp = await client.post("/v1/completions", json=body)
                assert resp.status == 200
                await resp.read()
            async with asyncio.timeout(30):
                while True:
                    resp = await client.get("/api/stats")
                    if resp.status == 200:
                        window = (await resp.json())["results"]["all"]["all"]
                        gpu = window["engine"]["speculative"].get("gpu")
                        if gpu is not None and gpu["up_samples"] >= 2:
                            break
                    await asyncio.sleep(0.1)
    assert gpu["memory_bandwidth"] == pytest.approx(0.953112)
    assert window["engine"]["baseline"]["gpu"] is None
    codes = {r["code"] for r in window["diagnosis"]["reasons"]}
    assert {"memory_bandwidth_saturated", "thermal_throttling"} <= codes
