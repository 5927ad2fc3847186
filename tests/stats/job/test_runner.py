from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pytest_aiohttp import AiohttpServer

from specproxy.config import ArmConfig, Config, ScrapeConfig, StatsConfig, StoreConfig
from specproxy.errors import ErrorKind
from specproxy.fleet.models import OTHER, ModelLabels
from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.scrape.dcgmloop import GpuScraper
from specproxy.stats.job import runner as job_module
from specproxy.stats.job.runner import StatsJob, compute_stats, window_label
from specproxy.store.memory import MemoryStore
from specproxy.store.postgres import PostgresStore
from tests.scrape.fakes import FakeMetricsServer
from tests.store.conftest import pg_cluster, pg_url  # noqa: F401 - fixtures

RUN = "r1"
DCGM = Path(__file__).resolve().parents[2] / "fixtures" / "dcgm-exporter"


def _records(n: int, t0: float, speedup: float, seed: int) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        arm = Arm.SPECULATIVE if i % 2 else Arm.BASELINE
        tokens = int(rng.integers(20, 200))
        tpot = rng.lognormal(np.log(0.02), 0.2) / (speedup if arm is Arm.SPECULATIVE else 1.0)
        ttft = rng.lognormal(np.log(0.1), 0.2)
        out.append(
            RequestRecord(
                request_id=f"q{i}",
                run_id=RUN,
                arm=arm,
                t_start=t0 + i * 0.1,
                model="m-a" if i % 4 < 2 else "m-b",
                endpoint="chat.completions",
                stream=True,
                status=200,
                e2e_s=ttft + tpot * (tokens - 1),
                upstream_s=ttft + tpot * (tokens - 1),
                ttft_s=ttft,
                tpot_s=tpot,
                prompt_tokens=50,
                output_tokens=tokens,
            )
        )
    return out


def _typo_404() -> RequestRecord:
    """A request for a model nobody serves (a 404 the proxy still records)."""
    return RequestRecord(
        "typo", RUN, Arm.BASELINE, 1002.0, "no-such-model", "completions", False, 404, 0.01, 0.01
    )


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for rec in _records(1600, 1000.0, 1.5, 0):
        s.record(rec)
    s.record(
        RequestRecord(
            "bad",
            RUN,
            Arm.BASELINE,
            1001.0,
            "m-a",
            "completions",
            False,
            502,
            0.1,
            0.1,
            error_kind=ErrorKind.HTTP_5XX,
        )
    )
    # A request for a model nobody serves: recorded (404), but no model of the result.
    s.record(_typo_404())
    s.record_engine(
        EngineSample(
            1000.0,
            RUN,
            Arm.SPECULATIVE,
            True,
            acceptance_rate=0.8,
            mean_acceptance_length=3.0,
            position_acceptance=(0.9, 0.8, 0.7),
        )
    )
    s.record_engine(EngineSample(1040.0, RUN, Arm.SPECULATIVE, True))
    s.record_engine(EngineSample(1050.0, RUN, Arm.SPECULATIVE, True, restarted=True))
    await s.flush()
    yield s
    await s.close()


CFG = StatsConfig(windows_s=(60.0, None), resamples=200, warmup_requests=5)
SCRAPE = ScrapeConfig(warmup_requests=20, warmup_seconds=0.0)


def test_window_labels() -> None:
    assert [window_label(w) for w in (300.0, 3600.0, None, 90.0, 86400.0)] == [
        "5m",
        "1h",
        "all",
        "90s",
        "1d",
    ]


async def test_compute_stats_end_to_end(store: MemoryStore) -> None:
    result = await compute_stats(
        store, run_id=RUN, stats_cfg=CFG, scrape_cfg=SCRAPE, window_end=1160.0
    )
    assert set(result["results"]) == {"all", "m-a", "m-b"}
    res = result["results"]["all"]["all"]
    # 800 per arm minus 5 warm-up after start; the speculative arm loses 20 after the restart,
    # dated at the scrape before the one that saw it (t=1040); the 502 is not usable
    assert res["samples"] == {"baseline": 795, "speculative": 775}
    assert res["excluded_warmup"] == {"baseline": 5, "speculative": 25}
    tpot = res["metrics"]["tpot"]
    lower, upper = tpot["speedup"]["median"]["lower"], tpot["speedup"]["median"]["upper"]
    assert lower is not None and lower > 1.3
    assert upper is not None and upper < 1.7
    assert tpot["verdict"] == "faster"
    adjusted = res["metrics"]["e2e"]["adjusted"]
    assert adjusted is not None and adjusted["lower"] is not None and adjusted["lower"] > 1.3
    assert res["metrics"]["e2e"]["speedup"]["p99"]["status"] == "ok"
    assert res["engine"]["speculative"]["restarts"] == 1
    assert res["diagnosis"]["summary"].startswith("speculation helps")
    last_minute = result["results"]["m-a"]["1m"]
    assert 0 < last_minute["samples"]["baseline"] < 200
    assert last_minute["metrics"]["e2e"]["speedup"]["p99"]["status"] == "insufficient"
    json.dumps(result, allow_nan=False)  # JSON-able, no NaN


async def test_per_model_results_are_bounded_by_the_model_labels(store: MemoryStore) -> None:
    labels = ModelLabels(allow=["m-a"])  # m-b is served by no arm: it becomes "other"
    for i in range(50):  # a client inventing model names
        store.record(
            RequestRecord(
                f"x{i}",
                RUN,
                Arm.BASELINE,
                1100.0 + i * 0.01,
                f"junk-{i}",
                "completions",
                False,
                200,
                0.1,
                0.1,
            )
        )
    await store.flush()
    result = await compute_stats(
        store,
        run_id=RUN,
        stats_cfg=CFG,
        scrape_cfg=SCRAPE,
        window_end=1160.0,
        model_label=labels.label,
    )
    assert set(result["results"]) == {"all", "m-a", OTHER}
    assert len(result["results"]) <= labels.bound + 1  # + "all"
    other = result["results"][OTHER]["all"]["samples"]
    plain = await compute_stats(
        store, run_id=RUN, stats_cfg=CFG, scrape_cfg=SCRAPE, window_end=1160.0
    )
    assert len(plain["results"]) == 3 + 50  # unbounded without the labels
    assert other["baseline"] == plain["results"]["m-b"]["all"]["samples"]["baseline"] + 50


async def test_job_publishes_gauges_and_history(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    job = StatsJob(
        store, run_id=RUN, stats_cfg=CFG, scrape_cfg=SCRAPE, registry=registry, clock=lambda: 1160.0
    )
    assert job.latest() is None
    assert b"specproxy_speedup_ratio{" not in generate_latest(registry)
    await job.run_once()
    text = generate_latest(registry).decode()
    # the verdict is a state set: one series per state, 1 on the current one
    verdict = 'specproxy_verdict{metric="tpot",model="all",specproxy_verdict="%s",window="all"}'
    assert verdict % "faster" + " 1.0" in text
    assert verdict % "inconclusive" + " 0.0" in text
    assert verdict % "slower" + " 0.0" in text
    assert 'specproxy_samples{arm="baseline",model="all",window="all"} 795.0' in text
    assert 'bound="lower",metric="tpot",model="m-b",statistic="median",window="all"' in text
    assert 'specproxy_p99_slowdown{metric="e2e",model="all",window="all"} 0.0' in text
    assert "specproxy_stats_last_run_timestamp_seconds" in text
    # freshness: the newest record started at 1000 + 1599 * 0.1; lag = computed_at - that
    latest = job.latest()
    assert latest is not None and latest.get("data_horizon") == pytest.approx(1159.9)
    lag = latest.get("lag_s")
    assert lag is not None and lag == pytest.approx(latest["computed_at"] - 1159.9)
    lag_lines = [x for x in text.splitlines() if x.startswith("specproxy_stats_data_lag_seconds ")]
    assert [float(x.split()[1]) for x in lag_lines] == [pytest.approx(lag)]
    history = await store.read_stats_history(run_id=RUN)
    assert len(history) == 1 and history[0][1]["run_id"] == RUN


async def test_a_whole_run_crossing_stays_and_the_headline_follows_it(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    job = StatsJob(
        store, run_id=RUN, stats_cfg=CFG, scrape_cfg=SCRAPE, registry=registry, clock=lambda: 1160.0
    )
    first = await job.run_once()
    assert "TTFT" not in first["results"]["all"]["all"]["diagnosis"]["summary"]
    # a tick in between saw the TTFT two-sample P99 test cross (what the memory remembers)
    between = copy.deepcopy(first)
    seq = between["results"]["all"]["all"]["metrics"]["ttft"]["sequential"]
    assert seq is not None and "p99" in seq and not seq["p99"]["slower"]["rejected"]
    seq["p99"]["slower"]["rejected"] = True
    job._memory.apply(between, tolerance=CFG.p99_tolerance)
    latest = await job.run_once()
    window = latest["results"]["all"]["all"]
    assert window["metrics"]["ttft"]["verdict"] == "slower"
    assert "TTFT P99 slower" in window["diagnosis"]["summary"]
    text = generate_latest(registry).decode()
    assert 'specproxy_p99_slowdown{metric="ttft",model="all",window="all"} 1.0' in text
    # sliding windows are not remembered
    assert latest["results"]["all"]["1m"]["metrics"]["ttft"]["verdict"] != "slower"


async def test_every_tick_computes_on_the_jobs_one_thread(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread (so one malloc arena) computes every tick, never the loop's default pool."""
    threads: list[str] = []
    real = job_module.compute_from_arrays

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(job_module, "compute_from_arrays", spy)
    job = StatsJob(store, run_id=RUN, stats_cfg=CFG, scrape_cfg=SCRAPE, clock=lambda: 1160.0)
    for _ in range(3):
        await job.run_once()
        await asyncio.to_thread(lambda: None)  # the default pool gets a thread of its own
    await job.close()
    assert len(threads) == 3 and len(set(threads)) == 1, threads
    assert threads[0].startswith("specproxy-stats")
    await job.run_once()  # a closed job computes again on a new thread of its own
    await job.close()
    assert len(threads) == 4 and threads[3].startswith("specproxy-stats")


async def test_job_runs_periodically_and_stops() -> None:
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    job = StatsJob(s, run_id=RUN, stats_cfg=StatsConfig(interval_s=0.01, resamples=100))
    await job.start()
    try:
        for _ in range(200):
            if len(await s.read_stats_history(run_id=RUN)) >= 2:
                break
            await asyncio.sleep(0.01)
    finally:
        await job.close()
    assert len(await s.read_stats_history(run_id=RUN)) >= 2
    empty = job.latest()
    assert empty is not None
    assert empty["results"]["all"]["all"]["metrics"]["e2e"]["verdict"] == "inconclusive"
    await s.close()


class Switch:
    """A `Leadership` the test flips."""

    def __init__(self, leader: bool) -> None:
        self.leader = leader
        self.closed = False

    async def is_leader(self) -> bool:
        return self.leader

    async def close(self) -> None:
        self.closed = True


async def test_only_the_leader_computes_and_another_takes_over(store: MemoryStore) -> None:
    """Two computing processes on one store: the one that does not lead waits (computes and
    writes nothing) until the lock is free, then computes; each reports its leadership."""
    now = [1160.0]
    lead, wait = Switch(True), Switch(False)
    heard: dict[str, list[bool]] = {"a": [], "b": []}
    first = StatsJob(
        store,
        run_id=RUN,
        stats_cfg=CFG,
        scrape_cfg=SCRAPE,
        clock=lambda: now[0],
        leadership=lead,
        on_leadership=heard["a"].append,
    )
    second = StatsJob(
        store,
        run_id=RUN,
        stats_cfg=CFG,
        scrape_cfg=SCRAPE,
        clock=lambda: now[0],
        leadership=wait,
        on_leadership=heard["b"].append,
    )
    assert await second.step() is None and second.is_leader() is False
    computed = await first.step()
    assert computed is not None and first.is_leader() is True
    assert await second.step() is None and second.latest() is None  # it waits, computes nothing
    assert len(await store.read_stats_history(run_id=RUN)) == 1
    # The leader dies; at the other's next interval the lock is free: it computes.
    lead.leader, wait.leader = False, True
    now[0] += CFG.interval_s
    mine = await second.step()
    assert second.is_leader() is True and mine is not None
    assert mine["computed_at"] >= computed["computed_at"]
    history = await store.read_stats_history(run_id=RUN)
    assert len(history) == 2  # each interval's result was written once, by its leader
    assert heard == {"a": [True], "b": [False, True]}  # changes only
    await second.close()
    assert wait.closed


@pytest.mark.parametrize("raw_rows_max", [200_000, 0], ids=["rows", "rollups"])
async def test_gpu_telemetry_scraped_end_to_end_reaches_the_diagnosis(
    store: MemoryStore, aiohttp_server: AiohttpServer, raw_rows_max: int
) -> None:
    # A fake dcgm-exporter (port 0) serving the derived hot page: GPU 0 at DRAM active 0.95 with
    # reasons sw_thermal|hw_thermal. Only the speculative arm has telemetry. The scraper records
    # into the store and the job reads the samples back from it (no in-memory hand-over).
    exporter = FakeMetricsServer(body=(DCGM / "derived_h200_hot_saturated.prom").read_text())
    url = str((await aiohttp_server(exporter.app())).make_url(""))
    cfg = Config(
        speculative=ArmConfig(urls=("http://127.0.0.1:1",), dcgm_urls=(url,)),
        baseline_url="http://127.0.0.1:2",
        run_id=RUN,
    )
    now = [0.0]
    async with aiohttp.ClientSession() as session:
        scraper = GpuScraper(cfg, {arm: session for arm in Arm}, store, clock=lambda: now[0])
        for t in (1020.0, 1120.0, 1150.0):
            now[0] = t
            await scraper.scrape_once()
    await store.flush()
    job = StatsJob(
        store,
        run_id=RUN,
        stats_cfg=dataclasses.replace(CFG, raw_rows_max=raw_rows_max),
        scrape_cfg=SCRAPE,
        clock=lambda: 1160.0,
    )
    result = await job.run_once()
    assert result["source"] == ("rows" if raw_rows_max else "rollups")
    for window, scrapes in (("1m", 2), ("all", 3)):
        res = result["results"]["all"][window]
        gpu = res["engine"]["speculative"].get("gpu")
        assert gpu is not None and gpu["samples"] == scrapes
        assert gpu["memory_bandwidth"] == pytest.approx(0.953112)
        assert gpu["thermal_throttle_share"] == 1.0
        assert gpu["clock_reasons"] == ["hw_thermal", "power_cap", "sw_thermal"]
        assert res["engine"]["baseline"].get("gpu") is None
        diagnosis = res["diagnosis"]
        codes = [r["code"] for r in diagnosis["reasons"]]
        assert {"memory_bandwidth_saturated", "thermal_throttling"} <= set(codes)
        skipped = diagnosis.get("not_evaluated", [])
        assert [r["code"] for r in skipped] == ["memory_bandwidth_saturated", "thermal_throttling"]
        assert all("baseline" in r["message"] for r in skipped)
    json.dumps(result, allow_nan=False)


async def test_a_tick_summarises_the_newest_stored_gpu_samples_of_each_arm(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The read is bounded (GPU_SAMPLES_READ per arm, the newest): here 2, so of three throttled
    # scrapes and one cool, newer one the whole-run window sees the newest two.
    monkeypatch.setattr(job_module, "GPU_SAMPLES_READ", 2)
    for t, hot in ((1000.0, True), (1010.0, True), (1020.0, True), (1030.0, False)):
        store.record_gpu(
            GpuSample(t=t, arm=Arm.BASELINE, up=True, run_id=RUN, thermal_throttled=hot)
        )
    store.record_gpu(GpuSample(t=1000.0, arm=Arm.BASELINE, up=True, run_id="other"))
    await store.flush()
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    gpu = result["results"]["all"]["all"]["engine"]["baseline"]["gpu"]
    assert gpu is not None and gpu["samples"] == 2 and gpu["thermal_throttle_share"] == 0.5
    assert result["results"]["all"]["all"]["engine"]["speculative"]["gpu"] is None


async def test_a_single_model_run_reuses_the_all_results_and_a_stray_model_does_not() -> None:
    single = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await single.start()
    for rec in _records(800, 1000.0, 1.5, 3):
        single.record(dataclasses.replace(rec, model="only"))
    await single.flush()
    result = await compute_stats(single, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    assert set(result["results"]) == {"all", "only"}
    # identical rows: the per-model result is the "all" one, draws included (not a second
    # bootstrap with other random numbers), and a separate copy
    assert result["results"]["only"] == result["results"]["all"]
    assert result["results"]["only"] is not result["results"]["all"]

    # one 404 for another model: "only" no longer holds every row, so it is computed on its own
    # (other draws), with the same usable samples
    single.record(_typo_404())
    await single.flush()
    again = await compute_stats(single, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    assert set(again["results"]) == {"all", "only"}
    alone, pooled = again["results"]["only"]["all"], again["results"]["all"]["all"]
    assert alone["samples"] == pooled["samples"]
    assert alone["metrics"]["e2e"]["speedup"] != pooled["metrics"]["e2e"]["speedup"]
    await single.close()


async def test_a_new_leader_after_failover_diagnoses_the_gpu_samples_of_the_old_one(
    pg_url: str,  # noqa: F811 - the fixture
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
) -> None:
    # Two replicas on one real PostgreSQL. Replica A scrapes the (fake, port 0) dcgm-exporter of
    # the speculative arm and leads; it dies. Replica B starts afterwards with no scraper history
    # of its own, takes the lead, and still diagnoses the hot GPU from the stored samples.
    exporter = FakeMetricsServer(body=(DCGM / "derived_h200_hot_saturated.prom").read_text())
    url = str((await aiohttp_server(exporter.app())).make_url(""))
    cfg = Config(
        speculative=ArmConfig(urls=("http://127.0.0.1:1",), dcgm_urls=(url,)),
        baseline_url="http://127.0.0.1:2",
        run_id=RUN,
    )
    replica_a = PostgresStore(StoreConfig(url=pg_url, spill_path=str(tmp_path / "a")), run_id=RUN)
    await replica_a.start()
    for rec in _records(1600, 1000.0, 1.5, 0):
        replica_a.record(rec)
    now = [0.0]
    async with aiohttp.ClientSession() as session:
        scraper = GpuScraper(cfg, {arm: session for arm in Arm}, replica_a, clock=lambda: now[0])
        for t in (1120.0, 1140.0, 1150.0):
            now[0] = t
            await scraper.scrape_once()
    await replica_a.close()  # everything it buffered is in PostgreSQL; its memory is gone

    replica_b = PostgresStore(StoreConfig(url=pg_url, spill_path=str(tmp_path / "b")), run_id=RUN)
    await replica_b.start()
    job = StatsJob(
        replica_b,
        run_id=RUN,
        stats_cfg=CFG,
        scrape_cfg=SCRAPE,
        clock=lambda: 1160.0,
        leadership=Switch(True),
    )
    result = await job.step()
    await job.close()
    await replica_b.close()
    assert result is not None and job.is_leader() is True
    window = result["results"]["all"]["all"]
    gpu = window["engine"]["speculative"]["gpu"]
    assert gpu is not None and gpu["samples"] == 3 and gpu["thermal_throttle_share"] == 1.0
    codes = {r["code"] for r in window["diagnosis"]["reasons"]}
    assert {"memory_bandwidth_saturated", "thermal_throttling"} <= codes
