"""The proxy's side of the statistics (`stats.job.follower`): it serves the newest result the
computing process stored, reads only what is newer than what it holds, and never computes."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from specproxy.config import StoreConfig
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.follower import FOLLOW_INTERVALS, FOLLOW_SLACK_S, StatsFollower
from specproxy.stats.job.runner import StatsJob
from specproxy.stats.result import StatsResult
from specproxy.store.memory import MemoryStore
from tests.stats.job.runs import CFG, RUN, WARMUP


class CountingHistory:
    """A store history that records every read's `newer_than`."""

    def __init__(self) -> None:
        self.rows: list[tuple[float, dict[str, Any]]] = []
        self.reads: list[float | None] = []

    async def latest_stats(
        self, *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None:
        self.reads.append(newer_than)
        if not self.rows or (newer_than is not None and self.rows[-1][0] <= newer_than):
            return None
        return self.rows[-1]


@pytest.fixture
async def empty() -> AsyncIterator[MemoryStore]:
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    yield s
    await s.close()


async def test_the_follower_serves_the_leaders_result_and_the_same_gauges(
    store: MemoryStore,
) -> None:
    leader_registry, follower_registry = CollectorRegistry(), CollectorRegistry()
    leader = StatsJob(
        store,
        run_id=RUN,
        stats_cfg=CFG,
        warmup=WARMUP,
        registry=leader_registry,
        clock=lambda: 1160.0,
    )
    follower = StatsFollower(store, run_id=RUN, interval_s=CFG.interval_s, clock=lambda: 1160.0)
    register_stats_collector(follower_registry, follower.latest, lambda: False)
    assert await follower.follow_once() is None  # nothing stored yet: nothing to serve
    computed = await leader.step()
    served = await follower.follow_once()
    assert served is not None and json.dumps(served) == json.dumps(computed)

    def gauges(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode().splitlines()
        return [line for line in text if line.startswith("specproxy_") and "leader" not in line]

    assert gauges(leader_registry) == gauges(follower_registry)  # identical across processes
    assert leader_registry.get_sample_value("specproxy_stats_leader") == 1.0
    assert follower_registry.get_sample_value("specproxy_stats_leader") == 0.0


def computed_at(result: StatsResult | None) -> float | None:
    return None if result is None else result["computed_at"]


def stored(t: float) -> tuple[float, dict[str, Any]]:
    return t, {"computed_at": t}


async def test_it_reads_only_what_is_newer_than_what_it_holds() -> None:
    history = CountingHistory()
    now = [10_000.0]
    follower = StatsFollower(history, run_id=RUN, interval_s=15.0, clock=lambda: now[0])
    bound = now[0] - FOLLOW_INTERVALS * 15.0 - FOLLOW_SLACK_S
    assert await follower.follow_once() is None
    assert history.reads == [bound]  # bounded: a long-dead leader's result is not served
    history.rows = [stored(9_990.0), stored(9_995.0)]
    assert computed_at(await follower.follow_once()) == 9_995.0
    now[0] += 15.0
    assert computed_at(await follower.follow_once()) == 9_995.0  # kept
    assert history.reads[-1] == 9_995.0  # only a row newer than the one held is read
    history.rows.append(stored(10_012.0))
    assert computed_at(await follower.follow_once()) == 10_012.0


async def test_an_old_result_ages_out_of_the_bounded_read() -> None:
    history = CountingHistory()
    history.rows = [stored(1_000.0)]
    follower = StatsFollower(history, run_id=RUN, interval_s=15.0, clock=lambda: 100_000.0)
    assert await follower.follow_once() is None  # the stale gauge stays absent: the alert fires


async def test_the_loop_polls_every_interval_and_survives_a_failing_read(
    empty: MemoryStore,
) -> None:
    calls = 0
    real = empty.latest_stats

    async def flaky(
        *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise OSError("store down")
        return await real(run_id=run_id, newer_than=newer_than)

    empty.latest_stats = flaky  # type: ignore[method-assign]
    follower = StatsFollower(empty, run_id=RUN, interval_s=0.01)
    await follower.start()
    await empty.write_stats(run_id=RUN, t=1e12, result={"computed_at": 1e12, "results": {}})
    try:
        for _ in range(6000):  # a slow machine only takes longer
            if follower.latest() is not None:
                break
            await asyncio.sleep(0.01)
    finally:
        await follower.close()
    assert calls >= 2
    assert computed_at(follower.latest()) == 1e12
