"""The ramp job over a real (memory) store: start, cut on a slower treatment, dry run, and a
decision overtaken by another writer is dropped."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from specproxy.config import RampConfig, StatsConfig, StoreConfig
from specproxy.control.events import ArmEvent
from specproxy.records import Arm
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.ramp import RampJob
from specproxy.stats.result import StatsResult
from specproxy.store.memory import MemoryStore
from tests.store.conftest import make_record

T0 = 1_700_000_000.0
CONTROL, TREATMENT = Arm("baseline"), Arm("speculative")


@pytest.fixture
async def store(tmp_path: Path) -> MemoryStore:
    st = MemoryStore(StoreConfig(url="memory://", spill_path=str(tmp_path / "spill.jsonl")))
    await st.start()
    return st


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
