"""The ramp job over a real (memory) store: start, cut on a slower treatment, dry run, and a
decision overtaken by another writer is dropped."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from specproxy.config import RampConfig, StatsConfig, StoreConfig
from specproxy.control.events import ArmEvent
from specproxy.records import Arm
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.ramp import CATCH_UP_S, LANDING_S, RampJob
from specproxy.stats.result import StatsResult
from specproxy.store.memory import MemoryStore
from tests.store.conftest import make_record

T0 = 1_700_000_000.0
CONTROL, TREATMENT = Arm("baseline"), Arm("speculative")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[MemoryStore]:
    st = MemoryStore(StoreConfig(url="memory://", spill_path=str(tmp_path / "spill.jsonl")))
    await st.start()
    yield st
    await st.close()  # its flusher stopped, not left to the loop's teardown


def _job(
    store: MemoryStore, registry: CollectorRegistry, now: list[float], **policy: object
) -> RampJob:
    """The job, its status exported on `registry` as a stats result carrying it would be."""
    job = RampJob(
        store,
        run_id="run",
        policy=RampConfig(enabled=True, min_samples=50, min_minutes=1, **policy),  # type: ignore[arg-type]
        stats_cfg=StatsConfig(),
        configured={"speculative": 0.5},
        run_start=T0,
        clock=lambda: now[0],
    )
    register_stats_collector(
        registry,
        lambda: cast(StatsResult, {"computed_at": now[0], "results": {}, "ramp": job.status()}),
    )
    return job


async def _traffic(
    store: MemoryStore, start: float, n: int, slow: float, errors: float = 0.0
) -> None:
    rng = np.random.default_rng(int(start))
    for i in range(n):
        arm = TREATMENT if i % 2 else CONTROL
        e2e = float(rng.lognormal(0.0, 0.3)) * (slow if arm is TREATMENT else 1.0)
        status = 500 if arm is TREATMENT and rng.random() < errors else 200
        store.record(
            make_record(
                int(start) * 10_000 + i, arm=arm, t_start=start + i * 0.05, e2e_s=e2e, status=status
            )
        )
    await store.flush()


def _sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


async def test_it_starts_steps_and_cuts_a_slower_treatment(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    now = [T0 + 1.0]
    job = _job(store, registry, now)
    await _traffic(store, T0, 40, slow=1.0)
    (start,) = await job.move()
    assert (start.move, start.weight) == ("start", 0.01)
    (event,) = await store.arm_events(run_id="run")
    assert (event.who, event.action, event.weight) == ("guard", "set", 0.01)
    assert _sample(registry, "specproxy_ramp_step", arm="speculative") == 1.0
    # the step's traffic (after the start event) is equal: step up after 50 requests and 1 min
    now[0] = event.t + 120.0
    await _traffic(store, event.t + 1.0, 400, slow=1.0)
    (step,) = await job.move()
    assert (step.move, step.weight) == ("step", 0.05), step.why
    assert _sample(registry, "specproxy_ramp_step", arm="speculative") == 2.0
    # a treatment twice as slow in the next step is cut, and the cut is an event
    events = await store.arm_events(run_id="run")
    now[0] = events[-1].t + 120.0
    await _traffic(store, events[-1].t + 1.0, 3000, slow=2.0)
    (cut,) = await job.move()
    assert (cut.move, cut.weight) == ("cut", 0.0)
    assert "E2E" in cut.why
    last = (await store.arm_events(run_id="run"))[-1]
    assert (last.who, last.weight) == ("guard", 0.0) and last.why.startswith("cut: ")
    assert _sample(registry, "specproxy_ramp_step", arm="speculative") == 0.0
    labels = {"arm": "speculative", "dry_run": "false"}
    assert _sample(registry, "specproxy_ramp_decisions_total", move="cut", **labels) == 1.0
    # a cut is final, and the arm at 0 costs no read of the requests however long the run goes
    reads = 0
    read_records = store.read_records

    async def counted(**kwargs: Any) -> Any:
        nonlocal reads
        reads += 1
        return await read_records(**kwargs)

    store.read_records = counted  # type: ignore[method-assign]
    now[0] += 600.0
    await _traffic(store, now[0] - 300.0, 100, slow=1.0)
    (after,) = await job.move()
    assert after.move == "hold" and "cut by the guard" in after.why
    assert len(await store.arm_events(run_id="run")) == 3
    assert reads == 0


async def test_an_erring_treatment_is_cut(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    now = [T0 + 1.0]
    job = _job(store, registry, now, schedule=(0.5,))
    await _traffic(store, T0, 4000, slow=1.0, errors=0.1)
    now[0] = T0 + 400.0
    (cut,) = await job.move()
    assert cut.move == "cut" and "error rate higher" in cut.why


async def test_dry_run_writes_nothing_and_counts_what_it_would_do(
    store: MemoryStore, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    now = [T0 + 1.0]
    job = _job(store, registry, now, dry_run=True)
    await _traffic(store, T0, 20, slow=1.0)
    with caplog.at_level(logging.WARNING, logger="specproxy.stats.job.ramp"):
        (start,) = await job.move()
    assert start.move == "start"
    assert [r.getMessage() for r in caplog.records] == [
        "ramp (dry run): would start speculative: start: weight 0.01 (the ramp's first step)"
    ]
    assert await store.arm_events(run_id="run") == []
    labels = {"arm": "speculative", "move": "start", "dry_run": "true"}
    assert _sample(registry, "specproxy_ramp_decisions_total", **labels) == 1.0
    # nothing changed: the arm stays at its configured 0.5, the schedule's step 4
    assert _sample(registry, "specproxy_ramp_step", arm="speculative") == 4.0
    # a treatment twice as slow at its configured weight: the log says it would be cut
    caplog.clear()
    now[0] = T0 + 600.0
    await _traffic(store, T0 + 2.0, 3000, slow=2.0)
    with caplog.at_level(logging.WARNING, logger="specproxy.stats.job.ramp"):
        (cut,) = await job.move()
    assert cut.move == "cut"
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("ramp (dry run): would cut speculative: cut: E2E")
    assert await store.arm_events(run_id="run") == []


class _Overtaken(MemoryStore):
    """A store where a person sets the weight between the ramp's decision and its write."""

    reads = 0

    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]:
        self.reads += 1
        if self.reads == 2:
            await self.add_arm_event(ArmEvent(run_id, T0 + 2.0, "set", "speculative", 0.2, "alice"))
        return await super().arm_events(run_id=run_id, after_id=after_id)


async def test_a_decision_overtaken_by_another_write_is_dropped(tmp_path: Path) -> None:
    store = _Overtaken(StoreConfig(url="memory://", spill_path=str(tmp_path / "spill.jsonl")))
    await store.start()
    job = _job(store, CollectorRegistry(), [T0 + 1.0])
    await _traffic(store, T0, 20, slow=1.0)
    (start,) = await job.move()
    assert start.move == "start"
    events = await store.arm_events(run_id="run")
    assert [(e.who, e.weight) for e in events] == [("alice", 0.2)]


class _Counted(MemoryStore):
    """A store that keeps how many rows each `read_records` returned."""

    def __init__(self, config: StoreConfig) -> None:
        super().__init__(config)
        self.reads: list[int] = []

    async def read_records(self, **kwargs: Any) -> Any:
        got = await super().read_records(**kwargs)
        self.reads.append(sum(len(rows) for rows in got.values()))
        return got


@pytest.fixture
async def counted(tmp_path: Path) -> AsyncIterator[_Counted]:
    st = _Counted(StoreConfig(url="memory://", spill_path=str(tmp_path / "spill.jsonl")))
    await st.start()
    yield st
    await st.close()


async def _steady(
    store: MemoryStore, start: float, end: float, *, per_s: float = 4.0, slow: float = 1.0
) -> list[float]:
    """Requests started in [start, end), alternating arms, E2E ~1 s (x `slow` for the
    treatment); returns their ends."""
    ends = []
    rng = np.random.default_rng(int(start))
    for k, t in enumerate(np.arange(start, end, 1.0 / per_s).tolist()):
        arm = TREATMENT if k % 2 else CONTROL
        e2e = float(rng.lognormal(0.0, 0.3)) * (slow if arm is TREATMENT else 1.0)
        store.record(make_record(int(t * 1000), arm=arm, t_start=t, e2e_s=e2e))
        ends.append(t + e2e)
    await store.flush()
    return ends


def _ended(ends: list[float], lo: float, hi: float) -> int:
    return sum(lo <= e < hi for e in ends)


@pytest.mark.parametrize("dry_run", [False, True])
async def test_a_held_step_reads_each_tick_only_what_landed_since_the_last(
    counted: _Counted, dry_run: bool
) -> None:
    """The final step (or a dry run, which never leaves the configured weight) held for an hour
    of 15 s ticks: each tick reads the requests that ended since the last one's read, each
    request once, never the step's history (the ramp read every request since the step began
    each tick: 14,400 rows at its last tick here)."""
    store = counted
    now = [T0 + 1.0]
    policy: dict[str, object] = {"dry_run": True} if dry_run else {"schedule": (0.5,)}
    job = _job(store, CollectorRegistry(), now, **policy)
    ends = await _steady(store, T0, now[0])
    (first,) = await job.move()
    assert first.move == "start"
    since = T0 if dry_run else (await store.arm_events(run_id="run"))[0].t
    read_until = since
    for _ in range(240):
        ends += await _steady(store, now[0], now[0] + 15.0)
        now[0] += 15.0
        (decision,) = await job.move()
        assert decision.move == ("start" if dry_run else "hold"), decision.why
        until = now[0] - StatsConfig().future_skew_s - LANDING_S  # what has surely landed
        assert store.reads[-1] == _ended(ends, read_until, until)  # what ended since, no more
        read_until = until
    assert len(ends) > 14_000 and max(store.reads) <= 80  # ~15 s of 4 req/s, whatever the age
    assert sum(store.reads) == _ended(ends, since, read_until)  # each request read once
    assert job.status()["speculative"]["behind_s"] == 0.0


@pytest.mark.parametrize("slow", [1.0, 2.0])
async def test_a_new_leader_replays_the_step_a_bounded_span_per_tick(
    counted: _Counted, slow: float
) -> None:
    """A leader that takes over 30 minutes into a step reads at most `CATCH_UP_S` of request
    ends per tick, holds while its guards catch up (then steps up a healthy treatment), and
    cuts a slower one on what it has read so far."""
    store = counted
    await store.add_arm_event(ArmEvent("run", T0, "set", "speculative", 0.05, "alice"))
    ends = await _steady(store, T0, T0 + 1800.0, slow=slow)
    now = [T0 + 1800.0]
    job = _job(store, CollectorRegistry(), now)  # the new leader
    read_until = T0
    moves = []
    for _ in range(10):
        (decision,) = await job.move()
        moves.append(decision.move)
        until = min(now[0] - StatsConfig().future_skew_s - LANDING_S, read_until + CATCH_UP_S)
        assert store.reads[-1] == _ended(ends, read_until, until)
        read_until = until
        if decision.move != "hold":
            break
        assert "the guards catch up" in decision.why
        assert job.status()["speculative"]["behind_s"] > 0
        now[0] += 15.0
        ends += await _steady(store, now[0] - 15.0, now[0], slow=slow)
    assert max(store.reads) <= CATCH_UP_S * 4 + 2
    if slow == 1.0:  # caught up after 1,800 s of ends at 300 s a tick: then it steps up
        assert moves == ["hold"] * 6 + ["step"]
    else:  # the first 300 s of the step already show the slower treatment
        assert moves == ["cut"]
