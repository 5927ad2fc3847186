"""The scraper inside the proxy app: started and stopped with it, exported on its /metrics."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
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


async def test_each_treatment_of_named_arms_is_scraped_for_its_own_acceptance(
    aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> None:
    """A/B/n: a control and two n-gram treatments (k = 2 and 4) configured as `[arms.NAME]`:
    acceptance and per-position acceptance are exported per treatment from its own engine's
    counters (their deltas between scrapes), the control exports none."""
    fakes = {
        "base": FakeMetricsServer(body=v1_text([EngineCounts(generation_tokens=5)], spec=False)),
        "ngram-k2": FakeMetricsServer(body=v1_text([EngineCounts(per_pos=(0, 0))])),
        "ngram-k4": FakeMetricsServer(body=v1_text([EngineCounts(per_pos=(0, 0, 0, 0))])),
    }
    urls = {name: str((await aiohttp_server(f.app())).make_url("/")) for name, f in fakes.items()}
    arms: dict[str, dict[str, object]] = {name: {"urls": [url]} for name, url in urls.items()}
    arms["base"]["role"] = "control"
    cfg = Config.from_mapping(
        {"arms": arms, "scrape": {"interval_s": 0.02, "timeout_s": SCRAPE_TIMEOUT_S}}
    )
    registry = CollectorRegistry()
    app = create_app(
        cfg, registry=registry, recorder=ListRecorder(), with_store=False, with_stats=False
    )
    client = await aiohttp_client(app)
    async with asyncio.timeout(10):
        while min(f.hits for f in fakes.values()) < 1:  # noqa: ASYNC110 - counted by the servers
            await asyncio.sleep(0.01)
    # the counters move: k2 accepted 14 of 20 draft tokens, k4 16 of 40, in 10 drafts each
    fakes["ngram-k2"].body = v1_text([EngineCounts(10, 20, 14, (8, 6), 40)])
    fakes["ngram-k4"].body = v1_text([EngineCounts(10, 40, 16, (7, 5, 3, 1), 40)])
    expected = {"ngram-k2": (0.7, (0.8, 0.6)), "ngram-k4": (0.4, (0.7, 0.5, 0.3, 0.1))}

    def exported(arm: str) -> tuple[float | None, tuple[float | None, ...]]:
        value = registry.get_sample_value
        k = len(expected[arm][1])
        positions = tuple(
            value(metrics.ENGINE_POSITION_ACCEPTANCE_RATIO, {"arm": arm, "position": str(p)})
            for p in range(k)
        )
        return value(metrics.ENGINE_ACCEPTANCE_RATIO, {"arm": arm}), positions

    async with asyncio.timeout(10):
        while any(exported(arm)[0] is None for arm in expected):  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    for arm, (rate, positions) in expected.items():
        got_rate, got_positions = exported(arm)
        assert got_rate == pytest.approx(rate)
        assert got_positions == pytest.approx(positions)
    body = await (await client.get("/metrics")).text()
    assert f'{metrics.ENGINE_POSITION_ACCEPTANCE_RATIO}{{arm="ngram-k4",position="3"}}' in body
    assert f'{metrics.ENGINE_POSITION_ACCEPTANCE_RATIO}{{arm="ngram-k2",position="2"}}' not in body
    assert f'{metrics.ENGINE_ACCEPTANCE_RATIO}{{arm="base"}}' not in body
    assert 'arm="base",position=' not in body
    await client.close()
