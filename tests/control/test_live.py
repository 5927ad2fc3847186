"""One replica's arm state: folded from the store, applied to the router and the gauges, kept
when the store cannot be read."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from specproxy.config import RoutingConfig, StoreConfig
from specproxy.control.events import ALL_ARMS, ArmEvent
from specproxy.control.live import RECENT_EVENTS, ArmControl
from specproxy.errors import StoreError
from specproxy.metrics import ARM_WEIGHT, CONTROL_POLL_FAILURES, EXPERIMENT_STOPPED, ProxyMetrics
from specproxy.proxy.routing import Router
from specproxy.store.memory import MemoryStore


def _gauge(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(name, labels)


@pytest.fixture
async def store(tmp_path: Path) -> MemoryStore:
    st = MemoryStore(StoreConfig(url="memory://", spill_path=str(tmp_path / "spill.jsonl")))
    await st.start()
    return st


def _control(store: MemoryStore, registry: CollectorRegistry) -> tuple[ArmControl, Router]:
    router = Router(RoutingConfig(speculative_share=0.5))
    control = ArmControl(
        run_id="run",
        configured={"speculative": 0.5},
        control="baseline",
        store=store,
        router=router,
        metrics=ProxyMetrics(registry),
    )
    return control, router


async def test_configured_state_until_events_then_their_fold(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    control, router = _control(store, registry)
    assert router.share == 0.5
    assert _gauge(registry, ARM_WEIGHT, arm="speculative") == 0.5
    assert _gauge(registry, ARM_WEIGHT, arm="baseline") == 0.5
    assert _gauge(registry, EXPERIMENT_STOPPED) == 0.0
    await store.add_arm_event(ArmEvent("run", 1.0, "set", "speculative", 0.2))
    await store.add_arm_event(ArmEvent("other-run", 1.0, "stop", ALL_ARMS))
    assert router.share == 0.5  # nothing applied before a poll
    assert await control.poll()
    assert router.share == 0.2
    assert _gauge(registry, ARM_WEIGHT, arm="baseline") == pytest.approx(0.8)
    stop = await control.submit(ArmEvent("run", 2.0, "stop", ALL_ARMS, who="bob"))
    assert router.share == 0.0 and control.state.stopped  # applied at once by the submitter
    assert control.state.last_id == stop.id
    assert _gauge(registry, EXPERIMENT_STOPPED) == 1.0
    assert _gauge(registry, ARM_WEIGHT, arm="speculative") == 0.0
    assert [e.action for e in control.recent] == ["set", "stop"]


async def test_an_unreadable_store_keeps_the_last_state_and_counts(store: MemoryStore) -> None:
    registry = CollectorRegistry()
    control, router = _control(store, registry)
    await control.submit(ArmEvent("run", 1.0, "set", "speculative", 0.3))
    store.fail_writes = True  # reads fail too
    assert not await control.poll()
    assert not await control.poll()
    assert router.share == 0.3
    assert control.poll_failures == 2
    assert _gauge(registry, CONTROL_POLL_FAILURES + "_total") == 2.0
    with pytest.raises(StoreError):  # a change that cannot be stored is not applied
        await control.submit(ArmEvent("run", 2.0, "stop", ALL_ARMS))
    assert not control.state.stopped
    store.fail_writes = False
    assert await control.poll()
    assert router.share == 0.3


async def test_a_stored_change_not_read_back_is_applied_without_skipping_others(
    store: MemoryStore,
) -> None:
    control, router = _control(store, CollectorRegistry())
    other = await store.add_arm_event(ArmEvent("run", 1.0, "pause", "speculative"))  # unseen
    real_read = store.arm_events

    async def failing_read(*, run_id: str, after_id: int = 0) -> list[ArmEvent]:
        raise StoreError("read replica down")

    store.arm_events = failing_read  # type: ignore[method-assign]
    mine = await control.submit(ArmEvent("run", 2.0, "set", "speculative", 0.9))
    assert control.state.weights["speculative"] == 0.9  # applied here at once ...
    assert control.state.last_id == 0  # ... without advancing past `other`
    store.arm_events = real_read  # type: ignore[method-assign]
    await control.poll()
    assert control.state.last_id == mine.id
    assert "speculative" in control.state.paused and router.share == 0.0
    assert [e.id for e in sorted(control.recent, key=lambda e: e.id)] == [other.id, mine.id]


async def test_recent_events_are_bounded(store: MemoryStore) -> None:
    control, _router = _control(store, CollectorRegistry())
    for i in range(RECENT_EVENTS + 5):
        await store.add_arm_event(ArmEvent("run", float(i), "set", "speculative", i / 100))
    await control.poll()
    assert len(control.recent) == RECENT_EVENTS
    assert control.state.weights["speculative"] == (RECENT_EVENTS + 4) / 100
