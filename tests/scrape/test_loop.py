"""The scrape loop against fake /metrics servers: derivation, failures, restarts, logging."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from specproxy import metrics
from specproxy.config import Config, ScrapeConfig
from specproxy.fleet.arms import Fleet
from specproxy.fleet.pool import Endpoint
from specproxy.records import SHORTHAND_ARMS, SHORTHAND_TREATMENT, Arm, EngineSample
from specproxy.scrape import loop as scrape_loop
from specproxy.scrape.collector import register_engine_collector
from specproxy.scrape.loop import EngineScraper
from tests.conftest import fixture_path
from tests.scrape.fakes import EngineCounts, FakeMetricsServer, ListRecorder, v1_text

START = 1.7e9
# A local fake answers in milliseconds, but a loaded machine can stall a scrape for longer than
# any short timeout (CI once saw "timed out" for a garbage page). Only the tests about timeouts
# get a short one, against a fake that hangs far past it; the others get one no stall reaches.
GENEROUS_TIMEOUT_S = 30.0
SHORT_TIMEOUT_S = 0.3
HANG_S = 5.0


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Rig:
    spec: FakeMetricsServer
    base: FakeMetricsServer
    scraper: EngineScraper
    recorder: ListRecorder
    clock: FakeClock
    registry: CollectorRegistry
    config: Config
    sessions: dict[Arm, aiohttp.ClientSession]

    def value(self, name: str, arm: Arm) -> float | None:
        labels = {"arm": arm}
        if name == metrics.ENGINE_UP:  # per endpoint; each arm here is one endpoint
            labels["endpoint"] = self.config.upstream_url(arm)
        return self.registry.get_sample_value(name, labels)


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.fixture
async def rig(aiohttp_server: AiohttpServer, request: pytest.FixtureRequest) -> AsyncIterator[Rig]:
    """Both arms' fakes and a scraper; `scrape.timeout_s` is the indirect parameter, if any."""
    timeout_s = getattr(request, "param", GENEROUS_TIMEOUT_S)
    spec = FakeMetricsServer(body=v1_text([EngineCounts(10, 40, 20, (8, 7, 3, 2), 100)]))
    base = FakeMetricsServer(body=v1_text([EngineCounts(generation_tokens=50)], spec=False))
    spec_server = await aiohttp_server(spec.app())
    base_server = await aiohttp_server(base.app())
    config = Config(
        speculative_url=str(spec_server.make_url("/")),
        baseline_url=str(base_server.make_url("/")),
        scrape=ScrapeConfig(interval_s=0.02, timeout_s=timeout_s),
        run_id="loop-test",
    )
    sessions = {arm: aiohttp.ClientSession() for arm in ("speculative", "baseline")}
    recorder, clock = ListRecorder(), FakeClock()
    scraper = EngineScraper(config, sessions, recorder, clock=clock)
    registry = CollectorRegistry()
    register_engine_collector(registry, scraper.states)
    yield Rig(spec, base, scraper, recorder, clock, registry, config, sessions)
    await scraper.close()
    for session in sessions.values():
        await session.close()


def scrape_logs(caplog: pytest.LogCaptureFixture, arm: Arm, level: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "specproxy.scrape"
        and r.levelno == level
        and r.getMessage().startswith(f"engine {arm}")
    ]


async def wait_for(condition: Callable[[], bool]) -> None:
    """Poll until `condition` holds; the generous deadline only guards against a hang."""
    async with asyncio.timeout(10.0):
        while not condition():  # noqa: ASYNC110 - the state lives in the scraper, not an Event
            await asyncio.sleep(0.01)


async def test_two_scrapes_derive_rates_and_record_everything(rig: Rig) -> None:
    first = await rig.scraper.scrape_once()
    assert first["speculative"].up and first["speculative"].acceptance_rate is None
    rig.clock.now += 10
    rig.spec.body = v1_text([EngineCounts(30, 120, 70, (26, 20, 14, 10), 400)])
    rig.base.body = v1_text([EngineCounts(generation_tokens=150)], spec=False)
    second = await rig.scraper.scrape_once()
    spec = second["speculative"]
    assert spec.acceptance_rate == pytest.approx(50 / 80)
    assert spec.mean_acceptance_length == pytest.approx(1 + 50 / 20)
    assert spec.position_acceptance == pytest.approx((18 / 20, 13 / 20, 11 / 20, 8 / 20))
    assert spec.generation_tokens_per_s == pytest.approx(30.0)
    assert second["baseline"].acceptance_rate is None
    assert second["baseline"].generation_tokens_per_s == pytest.approx(10.0)
    assert len(rig.recorder.engine_samples) == 4
    assert {s.run_id for s in rig.recorder.engine_samples} == {"loop-test"}
    # Exported by arm; the baseline has no acceptance series at all.
    assert rig.value(metrics.ENGINE_ACCEPTANCE_RATIO, "speculative") == pytest.approx(0.625)
    assert rig.value(metrics.ENGINE_ACCEPTANCE_RATIO, "baseline") is None
    assert rig.value(metrics.ENGINE_UP, "baseline") == 1.0


async def test_acceptance_is_held_through_idle_intervals(rig: Rig) -> None:
    await rig.scraper.scrape_once()
    rig.spec.body = v1_text([EngineCounts(30, 120, 70, (26, 20, 14, 10), 400)])
    await rig.scraper.scrape_once()
    idle = await rig.scraper.scrape_once()  # nothing drafted since
    assert idle["speculative"].acceptance_rate is None  # the stored sample has no rate
    assert rig.value(metrics.ENGINE_ACCEPTANCE_RATIO, "speculative") == pytest.approx(0.625)


async def test_real_fixture_is_served_and_parsed(rig: Rig) -> None:
    rig.spec.body = fixture_path("metrics_spec.prom").read_text()
    rig.base.body = fixture_path("metrics_baseline.prom").read_text()
    samples = await rig.scraper.scrape_once()
    assert samples["speculative"].up and samples["baseline"].up
    snapshot = rig.scraper.states["speculative"].snapshot
    assert snapshot is not None and snapshot.num_accepted_tokens == 124.0


@pytest.mark.parametrize(
    ("body", "status", "reason"),
    [
        ("<html>upstream connect error</html>", 200, "no vLLM engine metrics"),
        ("vllm:num_requests_running{engine=0} 1\n", 200, "not Prometheus text"),
        ("", 200, "no vLLM engine metrics"),
        ("vllm:num_requests_running 1\n", 503, "HTTP 503"),
    ],
)
async def test_garbage_or_http_error_marks_down(
    rig: Rig, body: str, status: int, reason: str
) -> None:
    rig.spec.body, rig.spec.status = body, status
    samples = await rig.scraper.scrape_once()
    assert samples["speculative"] == EngineSample(
        t=1000.0, run_id="loop-test", arm="speculative", up=False
    )
    state = rig.scraper.states["speculative"]
    assert state.up is False and state.error is not None and reason in state.error
    assert samples["baseline"].up  # the other arm is unaffected
    assert rig.value(metrics.ENGINE_UP, "speculative") == 0.0
    assert samples["speculative"] in rig.recorder.engine_samples  # down samples are stored


@pytest.mark.parametrize("rig", [SHORT_TIMEOUT_S], indirect=True)
async def test_timeout_marks_down(rig: Rig) -> None:
    rig.spec.delay = HANG_S  # far beyond scrape.timeout_s
    samples = await rig.scraper.scrape_once()
    assert not samples["speculative"].up
    assert rig.scraper.states["speculative"].error == "timed out"


async def test_refused_marks_down(aiohttp_server: AiohttpServer) -> None:
    base = FakeMetricsServer(body=v1_text([EngineCounts()], spec=False))
    base_server = await aiohttp_server(base.app())
    config = Config(speculative_url=closed_port_url(), baseline_url=str(base_server.make_url("/")))
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(config, {"speculative": session, "baseline": session})
        samples = await scraper.scrape_once()
    assert not samples["speculative"].up
    assert samples["baseline"].up
    error = scraper.states["speculative"].error
    assert error is not None and "Connect" in error


async def test_oversized_body_marks_down(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scrape_loop, "MAX_BODY_BYTES", 100)
    samples = await rig.scraper.scrape_once()
    assert not samples["speculative"].up
    assert "exceeds" in (rig.scraper.states["speculative"].error or "")


async def test_one_log_per_state_change(rig: Rig, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="specproxy.scrape")
    good = rig.spec.body
    await rig.scraper.scrape_once()  # up
    rig.spec.body = "garbage garbage"
    for _ in range(3):
        await rig.scraper.scrape_once()  # down, down, down
    rig.spec.status = 500
    await rig.scraper.scrape_once()  # still down, for another reason: no new log
    assert len(scrape_logs(caplog, "speculative", logging.WARNING)) == 1
    rig.spec.body, rig.spec.status = good, 200
    await rig.scraper.scrape_once()  # up again
    await rig.scraper.scrape_once()
    rig.spec.body = "garbage garbage"
    await rig.scraper.scrape_once()  # down again
    assert len(scrape_logs(caplog, "speculative", logging.WARNING)) == 2
    # INFO: the first success and the recovery.
    assert len(scrape_logs(caplog, "speculative", logging.INFO)) == 2
    assert scrape_logs(caplog, "baseline", logging.WARNING) == []


async def test_restart_by_start_time_is_counted_and_recorded(rig: Rig) -> None:
    counts = EngineCounts(10, 40, 20, (8, 7, 3, 2), 100)
    rig.spec.body = v1_text([counts], start_time=990.0)  # started before the first scrape
    await rig.scraper.scrape_once()
    rig.clock.now += 10
    rig.spec.body = v1_text([EngineCounts(1, 4, 2, (1, 1, 0, 0), 9)], start_time=1005.0)
    samples = await rig.scraper.scrape_once()
    assert samples["speculative"].restarted
    assert samples["speculative"].acceptance_rate is None
    assert rig.scraper.restart_times("speculative") == (1005.0,)
    assert rig.scraper.restart_times("baseline") == ()
    assert rig.value(metrics.ENGINE_RESTARTS + "_total", "speculative") == 1.0
    # The next interval measures the new process normally.
    rig.clock.now += 10
    rig.spec.body = v1_text([EngineCounts(11, 44, 32, (9, 9, 8, 6), 50)], start_time=1005.0)
    samples = await rig.scraper.scrape_once()
    assert not samples["speculative"].restarted
    assert samples["speculative"].acceptance_rate == pytest.approx(30 / 40)


async def test_restart_while_down_is_detected_on_recovery(rig: Rig) -> None:
    rig.spec.body = v1_text([EngineCounts(10, 40, 20, (8, 7, 3, 2), 100)], start_time=START)
    await rig.scraper.scrape_once()
    rig.spec.status = 502
    rig.clock.now += 5
    await rig.scraper.scrape_once()
    rig.clock.now += 5
    await rig.scraper.scrape_once()
    rig.spec.status = 200  # same start time, but the counters went back (engine core restart)
    rig.spec.body = v1_text([EngineCounts(2, 8, 4, (2, 1, 1, 0), 12)], start_time=START)
    rig.clock.now += 30
    samples = await rig.scraper.scrape_once()
    # no start time explains the drop: a restart, or another engine behind the URL
    assert not samples["speculative"].restarted
    assert rig.scraper.restart_times("speculative") == ()
    rig.spec.body = v1_text([EngineCounts(4, 16, 8, (4, 2, 1, 1), 30)], start_time=START)
    rig.clock.now += 5
    samples = await rig.scraper.scrape_once()  # grown from the new counters: a restart
    assert samples["speculative"].restarted
    # Dated at the first failed scrape: nothing new was served while the arm was down.
    assert rig.scraper.restart_times("speculative") == (1005.0,)


@pytest.mark.parametrize("rig", [SHORT_TIMEOUT_S], indirect=True)
async def test_periodic_loop_survives_failures_and_recovers(rig: Rig) -> None:
    good = rig.spec.body
    rig.spec.body = "<html>"
    await rig.scraper.start()
    await rig.scraper.start()  # idempotent: still one task
    await wait_for(lambda: rig.spec.hits >= 3)
    assert rig.scraper.states["speculative"].up is False
    rig.spec.body = good
    await wait_for(lambda: rig.scraper.states["speculative"].up is True)
    rig.spec.delay = HANG_S  # now it hangs past the timeout
    await wait_for(lambda: rig.scraper.states["speculative"].up is False)
    rig.spec.delay = 0.0
    await wait_for(lambda: rig.scraper.states["speculative"].up is True)
    await rig.scraper.close()
    hits = rig.spec.hits
    await asyncio.sleep(0.1)
    assert rig.spec.hits == hits  # closed: no more scrapes
    await rig.scraper.close()  # idempotent


async def test_a_failing_recorder_does_not_stop_the_loop(rig: Rig) -> None:
    class Broken(ListRecorder):
        def record_engine(self, sample: EngineSample) -> None:
            raise RuntimeError("disk full")

    scraper = EngineScraper(rig.config, rig.sessions, Broken())
    samples = await scraper.scrape_once()
    assert samples["speculative"].up and samples["baseline"].up


def ejected(ep: Endpoint) -> bool:
    """A call, so that mypy does not narrow the property between scrapes."""
    return ep.ejected


async def test_every_endpoint_of_an_arm_is_scraped_and_summed(
    aiohttp_server: AiohttpServer,
) -> None:
    """Two engines in one arm: per-endpoint deltas, up per endpoint, probes, served models."""
    one = FakeMetricsServer(body=v1_text([EngineCounts(10, 40, 20)], start_time=START))
    two = FakeMetricsServer(body=v1_text([EngineCounts(500, 2000, 100)], start_time=START + 7))
    one.models = two.models = ["qwen"]
    base = FakeMetricsServer(body=v1_text([EngineCounts()], spec=False), models=["qwen"])
    servers = [await aiohttp_server(s.app()) for s in (one, two, base)]
    url1, url2, url_base = (str(s.make_url("")).rstrip("/") for s in servers)
    config = Config.from_mapping(
        {
            "speculative": {"urls": [url1, url2]},
            "baseline_url": url_base,
            "outlier": {"eject_after_failures": 1, "base_ejection_s": 1, "max_ejection_s": 1},
            "model_allow": ["dev"],
        }
    )
    clock = FakeClock()
    fleet = Fleet(config, clock=clock)
    registry = CollectorRegistry()
    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(
            config, dict.fromkeys(("speculative", "baseline"), session), clock=clock, fleet=fleet
        )
        register_engine_collector(registry, scraper.states)
        await scraper.scrape_once()
        assert fleet.labels.label("qwen") == "qwen" and fleet.labels.label("x") == "other"
        one.body = v1_text([EngineCounts(20, 80, 50)], start_time=START)
        two.body = v1_text([EngineCounts(510, 2040, 110)], start_time=START + 7)
        clock.now += 5
        samples = await scraper.scrape_once()
        spec = samples["speculative"]
        assert spec.acceptance_rate == pytest.approx((30 + 10) / (40 + 40))
        assert not spec.restarted

        def up(url: str) -> float | None:
            return registry.get_sample_value(
                metrics.ENGINE_UP, {"arm": "speculative", "endpoint": url}
            )

        assert up(url1) == up(url2) == 1.0
        # Endpoint two dies (its ejection time has passed too): arm up, acceptance from one only
        pool = fleet.pool("speculative")
        ep2 = next(ep for ep in pool.endpoints if ep.url == url2)
        pool.release(pool.acquire(), ok=True)
        ep2.outstanding += 1
        pool.release(ep2, ok=False)
        assert ejected(ep2)
        two.status = 503
        one.body = v1_text([EngineCounts(30, 120, 70)], start_time=START)
        clock.now += 5
        spec = (await scraper.scrape_once())["speculative"]
        assert spec.up and not spec.restarted
        assert spec.acceptance_rate == pytest.approx(20 / 40)
        assert up(url1) == 1.0 and up(url2) == 0.0
        assert ejected(ep2)  # a failed probe keeps it out
        # It comes back (same process): a successful probe readmits it; no restart counted
        two.status = 200
        clock.now += 5
        spec = (await scraper.scrape_once())["speculative"]
        assert not ejected(ep2) and up(url2) == 1.0
        assert not spec.restarted and scraper.restart_times("speculative") == ()
        assert (
            registry.get_sample_value(metrics.ENGINE_RESTARTS + "_total", {"arm": "speculative"})
            == 0.0
        )


async def test_a_gateway_arm_scrapes_its_engines_and_probes_the_gateway_by_itself(
    aiohttp_server: AiohttpServer,
) -> None:
    """`metrics_urls`: the engines are scraped, never the gateway; the gateway's ejected
    endpoint is readmitted by its own probe (GET /v1/models: any answer below 500)."""
    engine = FakeMetricsServer(body=v1_text([EngineCounts(10, 40, 20)], start_time=START))
    gateway = FakeMetricsServer(body="litellm_requests_metric_total 1\n", models=["m"])
    base = FakeMetricsServer(body=v1_text([EngineCounts()], spec=False))
    servers = [await aiohttp_server(s.app()) for s in (engine, gateway, base)]
    url_engine, url_gateway, url_base = (str(s.make_url("")).rstrip("/") for s in servers)
    config = Config.from_mapping(
        {
            "speculative": {"urls": [url_gateway], "metrics_urls": [url_engine]},
            "baseline_url": url_base,
            "outlier": {"eject_after_failures": 1, "base_ejection_s": 1, "max_ejection_s": 1},
        }
    )
    clock = FakeClock()
    fleet = Fleet(config, clock=clock)
    pool = fleet.pool(SHORTHAND_TREATMENT)
    pool.release(pool.acquire(), ok=False)  # a failed request ejects the gateway

    def down() -> bool:  # a call, so that mypy does not narrow pool.down between the scrapes
        return pool.down

    async with aiohttp.ClientSession() as session:
        scraper = EngineScraper(
            config, {arm: session for arm in SHORTHAND_ARMS}, fleet=fleet, clock=clock
        )
        samples = await scraper.scrape_once()
        assert samples[SHORTHAND_TREATMENT].up and down()  # not due yet: no probe
        clock.now += 2
        await scraper.scrape_once()
        assert not down()  # the gateway answered /v1/models
        assert set(scraper.states[SHORTHAND_TREATMENT].endpoints) == {url_engine}
        assert gateway.hits == 0 and engine.hits == 2
        pool.release(pool.acquire(), ok=False)
        await servers[1].close()  # the gateway is gone: its probe is refused
        clock.now += 2
        await scraper.scrape_once()
        assert down()  # a refused probe ejects it again


async def test_engine_load_is_the_endpoint_latest_scrape(rig: Rig) -> None:
    url = rig.config.upstream_url(SHORTHAND_TREATMENT)
    assert rig.scraper.engine_load(SHORTHAND_TREATMENT, url) == (None, None)  # not scraped yet
    rig.spec.body = v1_text([EngineCounts(running=3, waiting=2), EngineCounts(running=4)])
    await rig.scraper.scrape_once()
    assert rig.scraper.engine_load(SHORTHAND_TREATMENT, url) == (7.0, 2.0)  # summed over engines
    assert rig.scraper.engine_load(SHORTHAND_TREATMENT, "http://unknown:1") == (None, None)
    rig.spec.status = 500
    await rig.scraper.scrape_once()  # the endpoint is down: its old load is no condition now
    assert rig.scraper.engine_load(SHORTHAND_TREATMENT, url) == (None, None)


def test_next_wait_keeps_parsing_under_its_share_of_a_core() -> None:
    assert scrape_loop.next_wait(5.0, 0.01) == 5.0  # a real page: the configured interval
    assert scrape_loop.next_wait(5.0, 0.5) == pytest.approx(10.0)  # 0.5 s of CPU at 5 %
    assert scrape_loop.next_wait(0.2, 1.0, share=0.5) == pytest.approx(2.0)
    for cpu in (0.0, 0.1, 0.7, 3.0):
        assert cpu / scrape_loop.next_wait(1.0, cpu) <= scrape_loop.CPU_SHARE + 1e-12
