from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from pytest_aiohttp import AiohttpServer

from specproxy.config import StatsConfig, StoreConfig
from specproxy.scrape.dcgmloop import GpuScraper
from specproxy.stats.anytime.decision import EProcess
from specproxy.stats.job import tick
from specproxy.stats.job.runner import StatsJob
from specproxy.store.memory import MemoryStore
from specproxy.store.postgres import PostgresStore
from tests.stats.job.runs import CFG, RUN, WARMUP, hot_gpu_config, records
from tests.store.conftest import pg_cluster, pg_url  # noqa: F401 - fixtures


async def test_job_publishes_gauges_and_history(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    job = StatsJob(
        store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, registry=registry, clock=lambda: 1160.0
    )
    assert job.latest() is None
    assert b"specproxy_speedup_ratio{" not in generate_latest(registry)
    await job.run_once()
    text = generate_latest(registry).decode()
    # the verdict is a state set: one series per state, 1 on the current one
    verdict = (
        'specproxy_verdict{arm="speculative",metric="tpot",model="all",'
        'specproxy_verdict="%s",window="all"}'
    )
    assert verdict % "faster" + " 1.0" in text
    assert verdict % "inconclusive" + " 0.0" in text
    assert verdict % "slower" + " 0.0" in text
    assert 'specproxy_samples{arm="baseline",model="all",window="all"} 795.0' in text
    assert 'bound="lower",metric="tpot",model="m-b",statistic="median",window="all"' in text
    slowdown = 'specproxy_p99_slowdown{arm="speculative",metric="%s",model="all",window="all"}'
    assert slowdown % "e2e" + " 0.0" in text
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
        store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, registry=registry, clock=lambda: 1160.0
    )
    first = await job.run_once()
    assert "TTFT" not in first["results"]["all"]["all"]["diagnosis"]["summary"]
    # a tick in between saw the TTFT exceedance P99 test cross (what the memory keeps)
    key = ("all", "all", "ttft")
    held = job._memory._kept[key].held
    assert held is not None and not held.slower.rejected
    crossed = dataclasses.replace(held, slower=EProcess(9.0, held.slower.boundary, True))
    job._memory.recall(key, crossed, at=1160.0, span_s=None)
    latest = await job.run_once()
    window = latest["results"]["all"]["all"]
    assert window["metrics"]["ttft"]["verdict"] == "slower"
    seq = window["metrics"]["ttft"]["sequential"]
    assert seq is not None and seq["hysteresis"] == "intersected" and seq["hysteresis_ticks"] == 3
    assert seq["decided_by"] == ["p99_exceedance"]
    assert "TTFT P99 slower" in window["diagnosis"]["summary"]
    text = generate_latest(registry).decode()
    slowdown = 'specproxy_p99_slowdown{arm="speculative",metric="%s",model="all",window="all"}'
    assert slowdown % "ttft" + " 1.0" in text
    # the 1m window never saw that crossing: its own memory
    assert latest["results"]["all"]["1m"]["metrics"]["ttft"]["verdict"] != "slower"


async def test_every_tick_computes_on_the_jobs_one_thread(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread (so one malloc arena) computes every tick, never the loop's default pool."""
    threads: list[str] = []
    real = tick.compute_tick

    def spy(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(tick, "compute_tick", spy)
    job = StatsJob(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, clock=lambda: 1160.0)
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
        warmup=WARMUP,
        clock=lambda: now[0],
        leadership=lead,
        on_leadership=heard["a"].append,
    )
    second = StatsJob(
        store,
        run_id=RUN,
        stats_cfg=CFG,
        warmup=WARMUP,
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


async def test_a_new_leader_goes_on_from_the_stored_evidence(store: MemoryStore) -> None:
    """A crossing the old leader kept stays with the new one (a process restart likewise), but
    not across a change of alpha: evidence holds only at the level it was gathered for."""
    old = StatsJob(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, clock=lambda: 1160.0)
    assert await old.step() is not None
    key = ("all", "all", "ttft")
    held = old._memory._kept[key].held
    assert held is not None and not held.slower.rejected
    crossed = dataclasses.replace(held, slower=EProcess(9.0, held.slower.boundary, True))
    old._memory.recall(key, crossed, at=1160.0, span_s=None)
    stored = await old.run_once()
    assert stored["results"]["all"]["all"]["metrics"]["ttft"]["verdict"] == "slower"
    await old.close()

    new = StatsJob(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, clock=lambda: 1160.0)
    first = await new.step()
    assert first is not None
    seq = first["results"]["all"]["all"]["metrics"]["ttft"]["sequential"]
    assert seq is not None and seq["hysteresis"] == "intersected"
    assert first["results"]["all"]["all"]["metrics"]["ttft"]["verdict"] == "slower"
    await new.close()

    other_alpha = dataclasses.replace(CFG, alpha=CFG.alpha / 2)
    fresh = StatsJob(store, run_id=RUN, stats_cfg=other_alpha, warmup=WARMUP, clock=lambda: 1160.0)
    again = await fresh.step()
    assert again is not None
    seq = again["results"]["all"]["all"]["metrics"]["ttft"]["sequential"]
    assert seq is not None and seq["hysteresis"] == "first"
    assert again["results"]["all"]["all"]["metrics"]["ttft"]["verdict"] != "slower"
    await fresh.close()


async def test_a_new_leader_after_failover_diagnoses_the_gpu_samples_of_the_old_one(
    pg_url: str,  # noqa: F811 - the fixture
    aiohttp_server: AiohttpServer,
    tmp_path: Path,
) -> None:
    # Two replicas on one real PostgreSQL. Replica A scrapes the (fake, port 0) dcgm-exporter of
    # the speculative arm and leads; it dies. Replica B starts afterwards with no scraper history
    # of its own, takes the lead, and still diagnoses the hot GPU from the stored samples.
    cfg = await hot_gpu_config(aiohttp_server)
    replica_a = PostgresStore(StoreConfig(url=pg_url, spill_path=str(tmp_path / "a")), run_id=RUN)
    await replica_a.start()
    for rec in records(1600, 1000.0, 1.5, 0):
        replica_a.record(rec)
    now = [0.0]
    async with aiohttp.ClientSession() as session:
        scraper = GpuScraper(
            cfg,
            {arm: session for arm in ("speculative", "baseline")},
            replica_a,
            clock=lambda: now[0],
        )
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
        warmup=WARMUP,
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


async def test_the_job_bounds_its_windows_by_its_own_clock(store: MemoryStore) -> None:
    """The job's clock is its now: at 1100.05 the run's rows from 1105.05 on (549 of them, past
    the 5 s allowance) are future rows, in no window and in the gauge. Its windows end at its
    clock, so the rows within the allowance wait for a later tick, and the horizon is capped
    there as before."""
    registry = CollectorRegistry()
    job = StatsJob(
        store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, registry=registry, clock=lambda: 1100.05
    )
    result = await job.run_once()
    assert result["future_rows"] == 549  # t = 1000 + 0.1 i for i = 1051..1599
    assert result["window_end"] == result["data_horizon"] == 1100.05
    whole = result["results"]["all"]["all"]
    assert whole["span"][1] <= 1101.0  # whole units up to the clock's
    # the rows of the units (1 s) up to the clock's, 1000-1100.9: 1010 (the 502 and the 404
    # are not usable), less the warm-up
    assert sum(whole["samples"].values()) + sum(whole["excluded_warmup"].values()) == 1010
    text = generate_latest(registry).decode()
    assert "specproxy_stats_future_rows 549.0" in text


async def test_a_tick_first_folds_the_rows_proxies_left_pending() -> None:
    """With deferred rollups (`store.rollups = "deferred"`) the proxies write rows only; the
    leader's tick folds them first, so its result is the one inline rollups give."""
    results = []
    for mode in ("inline", "deferred"):
        s = MemoryStore(StoreConfig(url="memory://", rollups=mode), run_id=RUN)
        await s.start()
        for rec in records(1600, 1000.0, 1.5, 0):
            s.record(rec)
        await s.flush()
        job = StatsJob(s, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, clock=lambda: 1160.0)
        try:
            results.append((await job.run_once())["results"])
            assert await s.fold_pending() == 0  # the tick took them all
        finally:
            await job.close()
            await s.close()
    inline, deferred = results
    assert json.dumps(deferred, sort_keys=True) == json.dumps(inline, sort_keys=True)
