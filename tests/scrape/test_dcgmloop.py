"""The GPU scraper against fake dcgm-exporters on port 0 serving verbatim and derived pages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from specproxy.config import ArmConfig, Config, ScrapeConfig
from specproxy.records import Arm
from specproxy.scrape.dcgmloop import GpuScraper
from tests.scrape.fakes import FakeMetricsServer, ListRecorder
from tests.scrape.test_loop import FakeClock, closed_port_url, wait_for

DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"


def page(name: str) -> str:
    return (DCGM / name).read_text(encoding="utf-8")


@dataclass
class GpuRig:
    hot: FakeMetricsServer  # the speculative arm's exporter
    cool: FakeMetricsServer  # the baseline arm's exporter
    hot_url: str
    cool_url: str
    scraper: GpuScraper
    clock: FakeClock
    sessions: dict[Arm, aiohttp.ClientSession]
    recorder: ListRecorder


# A loaded machine can stall a scrape of a local fake past any short timeout: only the timeout
# test gets a short one, against a fake that hangs far past it (as in test_loop).
GENEROUS_TIMEOUT_S = 30.0
SHORT_TIMEOUT_S = 0.3
HANG_S = 5.0


def config(spec: ArmConfig, base: ArmConfig, timeout_s: float = GENEROUS_TIMEOUT_S) -> Config:
    return Config(
        speculative=spec,
        baseline=base,
        scrape=ScrapeConfig(interval_s=0.02, timeout_s=timeout_s),
        run_id="gpu-run",
    )


@pytest.fixture
async def rig(
    aiohttp_server: AiohttpServer, request: pytest.FixtureRequest
) -> AsyncIterator[GpuRig]:
    """Hot and cool exporters; `scrape.timeout_s` is the indirect parameter, if any."""
    hot = FakeMetricsServer(body=page("derived_h200_hot_saturated.prom"))
    cool = FakeMetricsServer(body=page("derived_h200_cool.prom"))
    hot_url = str((await aiohttp_server(hot.app())).make_url(""))
    cool_url = str((await aiohttp_server(cool.app())).make_url("/metrics"))  # full URL works too
    cfg = config(
        ArmConfig(urls=("http://127.0.0.1:1",), dcgm_urls=(hot_url,)),
        ArmConfig(urls=("http://127.0.0.1:2",), dcgm_urls=(cool_url,)),
        getattr(request, "param", GENEROUS_TIMEOUT_S),
    )
    sessions = {arm: aiohttp.ClientSession() for arm in ("speculative", "baseline")}
    clock = FakeClock()
    recorder = ListRecorder()
    scraper = GpuScraper(cfg, sessions, recorder, clock=clock)
    yield GpuRig(hot, cool, hot_url, cool_url, scraper, clock, sessions, recorder)
    await scraper.close()
    for session in sessions.values():
        await session.close()


async def test_each_arm_reads_its_own_exporters(rig: GpuRig) -> None:
    samples = await rig.scraper.scrape_once()
    spec, base = samples["speculative"], samples["baseline"]
    assert (spec.up, spec.gpus, spec.thermal_throttled) == (True, 2, True)
    assert spec.memory_bandwidth == pytest.approx(0.953112)
    assert (base.up, base.thermal_throttled) == (True, False)
    assert base.memory_bandwidth == pytest.approx(0.41)
    assert rig.hot.hits == 1 and rig.cool.hits == 1
    state = rig.scraper.states["speculative"]
    assert state.up == {rig.hot_url: True} and state.latest == spec


async def test_every_scrape_is_recorded_with_its_time_and_run(rig: GpuRig) -> None:
    for t in (1000.0, 1005.0, 1010.0):
        rig.clock.now = t
        await rig.scraper.scrape_once()
    recorded = rig.recorder.gpu_samples
    spec = [s for s in recorded if s.arm == "speculative"]
    assert [s.t for s in spec] == [1000.0, 1005.0, 1010.0]
    assert len(recorded) == 6 and {s.run_id for s in recorded} == {"gpu-run"}
    assert spec[-1] == rig.scraper.states["speculative"].latest


@pytest.mark.parametrize(
    ("status", "body", "needle"),
    [
        (503, "busy", "HTTP 503"),
        (200, "<html>login</html>", "no DCGM fields"),
        (200, 'DCGM_FI_DEV_GPU_UTIL{gpu="0" 1\n', "not Prometheus text"),
    ],
)
async def test_a_bad_exporter_marks_the_arm_down_with_the_reason(
    rig: GpuRig, status: int, body: str, needle: str
) -> None:
    rig.hot.status, rig.hot.body = status, body
    spec = (await rig.scraper.scrape_once())["speculative"]
    assert not spec.up and spec.error is not None and needle in spec.error
    assert rig.scraper.states["speculative"].up == {rig.hot_url: False}


@pytest.mark.parametrize("rig", [SHORT_TIMEOUT_S], indirect=True)
async def test_timeout_marks_down(rig: GpuRig) -> None:
    rig.hot.delay = HANG_S  # far beyond scrape.timeout_s
    spec = (await rig.scraper.scrape_once())["speculative"]
    assert not spec.up and spec.error == "timed out"


async def test_one_exporter_of_two_down_keeps_the_arm_up(
    aiohttp_server: AiohttpServer, caplog: pytest.LogCaptureFixture
) -> None:
    good = FakeMetricsServer(body=page("derived_v100_mem_copy_fallback.prom"))
    good_url = str((await aiohttp_server(good.app())).make_url(""))
    dead = closed_port_url()
    cfg = config(
        ArmConfig(urls=("http://127.0.0.1:1",), dcgm_urls=(good_url, dead)),
        ArmConfig(urls=("http://127.0.0.1:2",)),  # no telemetry: not scraped at all
    )
    async with aiohttp.ClientSession() as session:
        scraper = GpuScraper(cfg, {arm: session for arm in ("speculative", "baseline")})
        assert set(scraper.states) == {"speculative"}
        with caplog.at_level(logging.WARNING, logger="specproxy.scrape.dcgm"):
            for _ in range(3):
                spec = (await scraper.scrape_once())["speculative"]
    assert spec.up and spec.gpus == 1 and spec.bandwidth_source == "mem_copy_util"
    assert scraper.states["speculative"].up == {good_url: True, dead: False}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and dead in warnings[0]  # once per state change


async def test_gpu_filter_is_applied(aiohttp_server: AiohttpServer) -> None:
    node = FakeMetricsServer(body=page("derived_h200_hot_saturated.prom"))
    url = str((await aiohttp_server(node.app())).make_url(""))
    cfg = config(
        ArmConfig(urls=("http://127.0.0.1:1",), dcgm_urls=(url,), dcgm_gpus=("1",)),
        ArmConfig(urls=("http://127.0.0.1:2",), dcgm_urls=(url,), dcgm_gpus=("0",)),
    )
    async with aiohttp.ClientSession() as session:
        samples = await GpuScraper(
            cfg, {arm: session for arm in ("speculative", "baseline")}
        ).scrape_once()
    # one node, two GPUs: GPU 1 serves the speculative arm, the throttled GPU 0 the baseline
    assert samples["speculative"].thermal_throttled is False
    assert samples["speculative"].clock_reasons == ("power_cap",)
    assert samples["baseline"].thermal_throttled is True
    assert samples["baseline"].temperature_c == 91.0


async def test_pod_filter_splits_one_kubernetes_node_between_the_arms(
    aiohttp_server: AiohttpServer,
) -> None:
    node = FakeMetricsServer(body=page("derived_k8s_pods.prom"))
    url = str((await aiohttp_server(node.app())).make_url(""))
    cfg = config(
        ArmConfig(dns="vllm-speculative.llm", dcgm_urls=(url,), dcgm_pods=("vllm-speculative-",)),
        ArmConfig(dns="vllm-baseline.llm", dcgm_urls=(url,), dcgm_pods=("vllm-baseline-",)),
    )
    async with aiohttp.ClientSession() as session:
        samples = await GpuScraper(
            cfg, {arm: session for arm in ("speculative", "baseline")}
        ).scrape_once()
    spec, base = samples["speculative"], samples["baseline"]
    assert (spec.gpus, spec.memory_bandwidth, spec.thermal_throttled) == (1, 0.9512, True)
    assert (base.gpus, base.memory_bandwidth, base.thermal_throttled) == (1, 0.4021, False)
    assert base.temperature_c == 52.0  # GPU 2 (95 °C, in no pod) counts for neither arm


async def test_the_periodic_loop_runs_and_stops(rig: GpuRig) -> None:
    await rig.scraper.start()
    await wait_for(lambda: rig.hot.hits >= 3)
    await rig.scraper.close()
    hits = rig.hot.hits
    await asyncio.sleep(0.1)
    assert rig.hot.hits == hits  # cancelled: no scrape after close


async def test_no_exporter_configured_starts_no_task() -> None:
    cfg = Config(baseline_url="http://127.0.0.1:1", speculative_url="http://127.0.0.1:2")
    async with aiohttp.ClientSession() as session:
        scraper = GpuScraper(cfg, {arm: session for arm in ("speculative", "baseline")})
        await scraper.start()
        assert scraper.states == {}
        assert await scraper.scrape_once() == {}
        await scraper.close()
