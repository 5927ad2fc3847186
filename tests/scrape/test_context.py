"""The scraper inside the proxy app: started and stopped with it, exported on its /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy import metrics
from specproxy.app import create_app
from specproxy.appkeys import GPU_SCRAPER, SCRAPER
from specproxy.config import ArmConfig, Config, ScrapeConfig
from tests.scrape.fakes import EngineCounts, FakeMetricsServer, ListRecorder, v1_text

DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"


# Both fakes answer in milliseconds; a timeout no stall of a loaded machine reaches, so a
# scrape is never "timed out" because CI was busy.
SCRAPE_TIMEOUT_S = 30.0


async def test_app_runs_the_scraper_and_exports_its_series(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    spec = FakeMetricsServer(body=v1_text([EngineCounts(10, 40, 20, (8, 7, 3, 2), 100)]))
    base = FakeMetricsServer(body=v1_text([EngineCounts(generation_tokens=5)], spec=False))
    spec_server = await aiohttp_server(spec.app())
    base_server = await aiohttp_server(base.app())
    cfg = Config(
        speculative_url=str(spec_server.make_url("/")),
        baseline_url=str(base_server.make_url("/")),
        scrape=ScrapeConfig(interval_s=0.02, timeout_s=SCRAPE_TIMEOUT_S),
    )
    registry, recorder = CollectorRegistry(), ListRecorder()
    app = create_app(cfg, registry=registry, recorder=recorder, with_store=False, with_stats=False)
    client = await aiohttp_client(app)
    scraper = app[SCRAPER]
    async with asyncio.timeout(10):
        while spec.hits < 2 or base.hits < 2:  # noqa: ASYNC110 - hits are counted by the server
            await asyncio.sleep(0.01)
    assert scraper.states["speculative"].up and scraper.states["baseline"].up
    assert any(s.arm == "speculative" and s.up for s in recorder.engine_samples)
    body = await (await client.get("/metrics")).text()
    spec_url = str(spec_server.make_url("")).rstrip("/")
    base_url = str(base_server.make_url("")).rstrip("/")
    assert f'{metrics.ENGINE_UP}{{arm="speculative",endpoint="{spec_url}"}} 1.0' in body
    assert f'{metrics.ENGINE_UP}{{arm="baseline",endpoint="{base_url}"}} 1.0' in body
    await client.close()
    hits = spec.hits
    await asyncio.sleep(0.1)
    assert spec.hits == hits  # the scrape task stopped with the app
    assert registry.get_sample_value(metrics.ENGINE_UP, {"arm": "speculative"}) is None


async def test_app_scrapes_the_gpu_exporters_and_exports_their_series(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    engine = FakeMetricsServer(body=v1_text([EngineCounts(generation_tokens=5)], spec=False))
    exporter = FakeMetricsServer(body=(DCGM / "derived_h200_cool.prom").read_text())
    engine_url = str((await aiohttp_server(engine.app())).make_url("")).rstrip("/")
    exporter_url = str((await aiohttp_server(exporter.app())).make_url("")).rstrip("/")
    cfg = Config(
        speculative=ArmConfig(urls=(engine_url,), dcgm_urls=(exporter_url,)),
        baseline_url=engine_url,
        scrape=ScrapeConfig(interval_s=0.02, timeout_s=SCRAPE_TIMEOUT_S),
    )
    registry, recorder = CollectorRegistry(), ListRecorder()
    app = create_app(cfg, registry=registry, recorder=recorder, with_store=False, with_stats=False)
    client = await aiohttp_client(app)
    async with asyncio.timeout(10):
        while exporter.hits < 2:  # noqa: ASYNC110 - hits are counted by the server
            await asyncio.sleep(0.01)
    assert set(app[GPU_SCRAPER].states) == {"speculative"}
    assert recorder.gpu_samples and {s.arm for s in recorder.gpu_samples} == {"speculative"}
    body = await (await client.get("/metrics")).text()
    assert f'{metrics.GPU_EXPORTER_UP}{{arm="speculative",endpoint="{exporter_url}"}} 1.0' in body
    assert f'{metrics.GPU_MEMORY_BANDWIDTH_RATIO}{{arm="speculative"}} 0.41' in body
    assert f'{metrics.GPU_THERMAL_THROTTLED}{{arm="speculative"}} 0.0' in body
    assert 'specproxy_gpu_utilization_ratio{arm="baseline"}' not in body  # no exporter there
