"""The store contract (`store.contract`), run against every backend: SQLite, a real PostgreSQL
and memory."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import numpy as np
import pytest

from specproxy.errors import StoreError
from specproxy.records import (
    GPU_ERROR_MAX_CHARS,
    MODEL_MAX_BYTES,
    RECORD_FIELDS,
    EngineSample,
    GpuSample,
)
from specproxy.stats.diagnosis import summarise_aggregate, summarise_engine
from specproxy.stats.warmup import restart_times
from specproxy.store.buffered import BufferedStore
from specproxy.store.factory import open_store
from specproxy.summary.engine import MEAN_FIELDS, EngineAggregate
from tests.store.conftest import eventually, make_record, store_config
from tests.store.helpers import read_arrays
from tests.summary.test_engine import random_engine_samples


async def test_every_field_round_trips(store: BufferedStore) -> None:
    rec = make_record(
        7,
        ttft_s=0.05,
        tpot_s=0.01,
        prompt_tokens=12,
        output_tokens=34,
        n_events=20,
        tokens_per_event=1.7,
        mean_gap_s=0.02,
        max_gap_s=0.2,
        acceptance_rate=0.6,
        mean_acceptance_length=2.5,
        pair_id="pair-1",
        shadow=True,
        error_kind="broken",
        disconnected=True,
        engine_url="http://10.0.0.1:8000",
        arm_in_flight=5,
        endpoint_in_flight=3,
        engine_running=4.0,
        engine_waiting=2.0,
        temperature=0.7,
        category="code",
    )
    store.record(rec)
    await store.flush()
    records = await store.read_records(run_id="run", columns=RECORD_FIELDS)
    assert set(records) == {rec.arm}  # the arms the run holds, each with its rows
    (row,) = records[rec.arm]
    assert type(row) is tuple
    assert dict(zip(RECORD_FIELDS, row, strict=True)) == rec.to_dict()
    # plain values: no enum, booleans as bool, counts as int
    assert [type(v) for v in row] == [type(v) for v in rec.to_dict().values()]
    arrays = await read_arrays(store, run_id="run", columns=RECORD_FIELDS)
    assert arrays[rec.arm]["shadow"].dtype == np.bool_
    assert arrays[rec.arm]["e2e_s"].dtype == np.float64


async def test_missing_values_are_nan_and_duplicates_are_ignored(store: BufferedStore) -> None:
    for i in range(4):
        store.record(make_record(i))
    store.record(make_record(2))  # same request id and arm: a replayed duplicate
    await store.flush()
    store.record(make_record(3))
    await store.flush()
    arrays = await read_arrays(store, run_id="run", columns=["request_id", "ttft_s", "e2e_s"])
    assert list(arrays["baseline"]["request_id"]) == ["req-0", "req-2"]
    assert list(arrays["speculative"]["request_id"]) == ["req-1", "req-3"]
    assert all(math.isnan(v) for v in arrays["baseline"]["ttft_s"])
    assert store.pending == 0 and store.dropped == 0


async def test_read_filters_window_usable_and_run(store: BufferedStore) -> None:
    for i in range(10):
        store.record(make_record(i, arm="baseline", model="a" if i < 5 else "b"))
    store.record(make_record(100, arm="baseline", shadow=True, t_start=1_700_000_003.5))
    store.record(make_record(101, arm="baseline", t_start=1_700_000_003.6, status=503))
    store.record(make_record(102, arm="baseline", t_start=1_700_000_003.7, error_kind="broken"))
    store.record(make_record(103, arm="baseline", t_start=1_700_000_003.8, disconnected=True))
    store.record(make_record(200, arm="baseline", run_id="other"))
    await store.flush()
    t0 = 1_700_000_000.0
    window = await store.read_records(run_id="run", columns=["t_start"], since=t0 + 2, until=t0 + 5)
    assert window == {
        "baseline": [
            (t0 + 2,),
            (t0 + 3,),
            (t0 + 3.5,),
            (t0 + 3.6,),
            (t0 + 3.7,),
            (t0 + 3.8,),
            (t0 + 4,),
        ],
    }  # only the arms the run holds
    usable = await store.read_records(
        run_id="run", columns=["t_start", "shadow"], since=t0 + 2, until=t0 + 5, usable_only=True
    )  # shadow rows stay: the paired design finds its pairs among them
    assert usable["baseline"] == [
        (t0 + 2, False),
        (t0 + 3, False),
        (t0 + 3.5, True),
        (t0 + 4, False),
    ]
    assert await store.models(run_id="run") == ["a", "b", "tiny"]
    assert await store.run_ids() == ["other", "run"]
    with pytest.raises(StoreError, match="unknown record column"):
        await store.read_records(run_id="run", columns=["t_start", "t_start; DROP TABLE x"])


async def test_read_by_end_returns_what_ended_in_the_span_however_old_its_start(
    store: BufferedStore,
) -> None:
    t0 = 1_700_000_000.0
    # (start, e2e): ends at 10, 12, 20 (started at 0: an old start), 12.5; 12.5 in another run
    for i, (start, e2e) in enumerate([(9.0, 1.0), (11.0, 1.0), (0.0, 20.0), (12.0, 0.5)]):
        store.record(make_record(i, arm="baseline", t_start=t0 + start, e2e_s=e2e))
    store.record(make_record(9, arm="baseline", run_id="other", t_start=t0 + 11.5, e2e_s=1.0))
    await store.flush()

    async def ended(lo: float, hi: float, since: float | None = None) -> list[float]:
        got = await store.read_records(
            run_id="run", columns=["t_start"], ended_since=t0 + lo, ended_until=t0 + hi, since=since
        )
        return [t - t0 for (t,) in got["baseline"]]

    assert await ended(10.0, 20.0) == [9.0, 11.0, 12.0]  # [lo, hi): 10 in, 20 out; start order
    assert await ended(12.0, 21.0) == [0.0, 11.0, 12.0]
    assert await ended(12.0, 21.0, since=t0 + 1.0) == [11.0, 12.0]  # and a bound on the start
    assert await ended(0.0, 10.0) == []
    assert await ended(30.0, 40.0) == []  # the arm is still named, with nothing in the span


async def test_engine_samples_and_stats_history(store: BufferedStore) -> None:
    samples = [
        EngineSample(
            t=10.0,
            run_id="run",
            arm="speculative",
            up=True,
            acceptance_rate=0.7,
            position_acceptance=(0.9, 0.7, 0.5),
        ),
        EngineSample(t=11.0, run_id="run", arm="baseline", up=False, restarted=True),
        EngineSample(t=12.0, run_id="run", arm="speculative", up=True, kv_cache_usage=0.3),
    ]
    for s in reversed(samples):
        store.record_engine(s)
    store.record_engine(samples[0])  # duplicate
    await store.flush()
    assert await store.read_engine_samples(run_id="run") == samples
    assert await store.read_engine_samples(run_id="run", since=11.0, arm="speculative") == [
        samples[2]
    ]
    await store.write_stats(run_id="run", t=2.0, result={"speedup": {"e2e": 1.4}})
    await store.write_stats(run_id="run", t=1.0, result={"n": [1, 2]})
    await store.write_stats(run_id="x", t=1.5, result={})
    assert await store.read_stats_history(run_id="run") == [
        (1.0, {"n": [1, 2]}),
        (2.0, {"speedup": {"e2e": 1.4}}),
    ]
    assert await store.read_stats_history(run_id="run", since=1.5) == [
        (2.0, {"speedup": {"e2e": 1.4}})
    ]
    assert await store.latest_stats(run_id="run") == (2.0, {"speedup": {"e2e": 1.4}})
    assert await store.latest_stats(run_id="run", newer_than=1.5) == (
        2.0,
        {"speedup": {"e2e": 1.4}},
    )
    assert await store.latest_stats(run_id="run", newer_than=2.0) is None  # nothing newer
    assert await store.latest_stats(run_id="nothing") is None


async def test_background_flush_without_explicit_flush(store: BufferedStore) -> None:
    store.record(make_record(1))
    assert store.pending == 1
    await eventually(lambda: store.pending == 0)
    assert store.pending == 0 and store.written == 1
    records = await store.read_records(run_id="run", columns=["request_id"])
    assert records["speculative"] == [("req-1",)]


async def test_retention_removes_only_old_rows(store: BufferedStore) -> None:
    now = time.time()
    store.record(make_record(1, t_start=now - 10 * 86400))
    store.record(make_record(2, t_start=now))
    store.record_engine(EngineSample(t=now - 10 * 86400, run_id="run", arm="baseline", up=True))
    await store.flush()
    await store.write_stats(run_id="run", t=now - 10 * 86400, result={"old": True})
    removed = await store.purge_older_than(now - 86400)
    assert removed == 3
    records = await store.read_records(run_id="run", columns=["request_id"])
    assert records == {"baseline": [("req-2",)]}
    assert await store.read_engine_samples(run_id="run") == []
    assert await store.read_stats_history(run_id="run") == []


async def test_close_flushes_everything(durable_backend_url: str, tmp_path: object) -> None:
    from pathlib import Path

    from specproxy.store.factory import open_store
    from tests.store.conftest import store_config

    assert isinstance(tmp_path, Path)
    cfg = store_config(durable_backend_url, tmp_path, flush_interval_s=1.0, batch_size=10_000)
    first = open_store(cfg)
    await first.start()
    for i in range(500):
        first.record(make_record(i))
    await first.close()
    assert first.pending == 0 and first.written == 500 and first.dropped == 0
    second = open_store(cfg)
    await second.start()
    records = await second.read_records(run_id="run", columns=["request_id"])
    assert sum(len(rows) for rows in records.values()) == 500
    await second.close()


async def test_a_huge_model_name_is_stored_bounded(store: BufferedStore) -> None:
    """Ten requests naming a 5 MB model store 256 bytes each (the string the client sent is cut
    before it is ever buffered), and a name no driver can take is stored cleaned."""
    for i in range(10):
        store.record(make_record(i, model="m" * 5_000_000))
    store.record(make_record(10, model="bad\ud800\x00name"))
    await store.flush()
    records = await store.read_records(run_id="run", columns=["request_id", "model"])
    models: dict[str, str] = dict(row for rows in records.values() for row in rows)
    assert len(models) == 11
    assert {models[f"req-{i}"] for i in range(10)} == {"m" * MODEL_MAX_BYTES}
    assert models["req-10"] == "bad?\ufffdname"


def _gpu_samples() -> list[GpuSample]:
    hot = GpuSample(
        t=10.0,
        arm="speculative",
        up=True,
        run_id="run",
        gpus=2,
        utilization=0.97,
        memory_bandwidth=0.953112,
        bandwidth_source="dram_active",
        sm_clock_mhz=1755.0,
        temperature_c=88.0,
        clock_reasons=("hw_thermal", "power_cap", "sw_thermal"),
        thermal_throttled=True,
    )
    idle = GpuSample(
        t=11.0, arm="speculative", up=True, run_id="run", gpus=1, clock_reasons=()
    )  # reasons exported, none active: () is not None
    down = GpuSample(t=10.5, arm="baseline", up=False, run_id="run", error="x" * 5000)
    return [hot, idle, down]


async def test_gpu_samples_round_trip_per_arm_in_time_order(store: BufferedStore) -> None:
    hot, idle, down = _gpu_samples()
    other_run = GpuSample(t=10.0, arm="baseline", up=True, run_id="other", gpus=1)
    for sample in (idle, down, hot, other_run, hot):  # out of order, one duplicate
        store.record_gpu(sample)
    await store.flush()
    assert down.error is not None and len(down.error) == GPU_ERROR_MAX_CHARS  # bounded row
    assert await store.read_gpu_samples(run_id="run") == {
        "speculative": [hot, idle],
        "baseline": [down],
    }
    assert await store.read_gpu_samples(run_id="run", since=10.5) == {
        "speculative": [idle],
        "baseline": [down],
    }
    assert await store.read_gpu_samples(run_id="run", limit=1) == {  # the newest per arm
        "speculative": [idle],
        "baseline": [down],
    }
    assert await store.read_gpu_samples(run_id="run", since=10.0, limit=0) == {}
    only_baseline = await store.read_gpu_samples(run_id="other")
    assert only_baseline == {"baseline": [other_run]}  # an arm without samples is absent
    assert await store.read_gpu_samples(run_id="nothing") == {}


async def test_retention_removes_old_gpu_samples(store: BufferedStore) -> None:
    now = time.time()
    old = GpuSample(t=now - 10 * 86400, arm="baseline", up=True, run_id="run")
    new = GpuSample(t=now, arm="baseline", up=True, run_id="run")
    store.record_gpu(old)
    store.record_gpu(new)
    await store.flush()
    assert await store.purge_older_than(now - 86400) == 1
    assert await store.read_gpu_samples(run_id="run") == {"baseline": [new]}


async def _check_engine_reads(store: BufferedStore) -> None:
    """The store's aggregates and restart samples against the per-sample functions applied to
    every stored sample (as read back, NaN included): same summaries (sums up to rounding), same
    restarts; window starts inside hours, on an hour boundary and after the last sample."""
    samples = await store.read_engine_samples(run_id="run")
    hour = 3600.0 * math.ceil(samples[len(samples) // 2].t / 3600)
    starts = [-math.inf, samples[len(samples) // 2].t, hour, samples[-5].t, samples[-1].t + 1.0]
    view = await store.read_engine(run_id="run", since=starts)
    aggregates, evidence = view.aggregates, view.restart_samples
    assert [s.t for s in evidence] == sorted(s.t for s in evidence)
    assert 0 < len(evidence) < len(samples) / 3
    for arm in ("speculative", "baseline"):
        assert restart_times(evidence, arm) == restart_times(samples, arm)
        for start in starts:
            expected = summarise_engine([s for s in samples if s.arm == arm and s.t >= start])
            got = summarise_aggregate(aggregates[start][arm])
            for field in ("samples", "restarts", "up_samples", "num_speculative_tokens"):
                assert getattr(got, field) == getattr(expected, field), (arm, start, field)
            for field in MEAN_FIELDS:
                mean = getattr(expected, field)
                assert getattr(got, field) == (mean and pytest.approx(mean, rel=1e-12))
    assert aggregates[starts[-1]]["baseline"] == EngineAggregate()


async def test_engine_aggregates_and_restart_samples_match_the_samples(
    store: BufferedStore,
) -> None:
    """What a stats tick reads instead of every engine sample (`SummaryReader.read_engine`),
    through writes in batches, duplicates (a replayed batch) and retention, which cuts an hour in
    two."""
    generated = random_engine_samples(7, n=3000, replicas=3)  # 5000 s: two hour boundaries
    for s in generated[:4000]:
        store.record_engine(s)
    await store.flush()
    for s in generated[3000:]:  # 1000 duplicates
        store.record_engine(s)
    store.record_engine(EngineSample(t=5.0, run_id="other", arm="baseline", up=True))
    await store.flush()
    assert len(await store.read_engine_samples(run_id="run")) == len(generated)
    await _check_engine_reads(store)
    cut = 3600.0 * math.ceil(generated[0].t / 3600) + 1234.5
    assert await store.purge_older_than(cut) > 0
    assert min(s.t for s in await store.read_engine_samples(run_id="run")) >= cut
    await _check_engine_reads(store)
    assert list((await store.read_engine(run_id="none", since=[])).restart_samples) == []


async def test_replicas_writing_engine_samples_at_once_keep_the_hours_exact(
    durable_backend_url: str, tmp_path: Path
) -> None:
    """Several proxies share one store and each writes its own scrapes (and, replaying a spill
    file, some of another's) in concurrent batches: the hour aggregates still hold every stored
    sample once."""
    generated = random_engine_samples(11, n=1500, replicas=3)
    stores = [
        open_store(store_config(durable_backend_url, tmp_path / f"r{i}", batch_size=50))
        for i in range(3)
    ]
    await asyncio.gather(*(s.start() for s in stores))
    try:

        async def replica(i: int) -> None:
            mine = generated[i::3] + generated[(i + 1) % 3 :: 3][:200]  # and some duplicates
            for k, sample in enumerate(mine):
                stores[i].record_engine(sample)
                if k % 50 == 0:
                    await asyncio.sleep(0)
            await stores[i].flush()

        await asyncio.gather(*(replica(i) for i in range(3)))
        assert len(await stores[0].read_engine_samples(run_id="run")) == len(generated)
        await _check_engine_reads(stores[0])
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    assert all(s.dropped == 0 for s in stores)


async def test_arm_events_are_stored_once_with_growing_ids_per_run(store: BufferedStore) -> None:
    from specproxy.control.events import ALL_ARMS, ArmEvent

    first = await store.add_arm_event(
        ArmEvent(run_id="run", t=1.0, action="set", arm="speculative", weight=0.25, why="ramp")
    )
    other = await store.add_arm_event(ArmEvent(run_id="x", t=2.0, action="stop", arm=ALL_ARMS))
    second = await store.add_arm_event(
        ArmEvent(run_id="run", t=3.0, action="stop", arm=ALL_ARMS, who="alice", why="p99 up")
    )
    assert 0 < first.id < other.id < second.id
    events = await store.arm_events(run_id="run")
    assert events == [first, second]
    assert events[0].weight == 0.25 and events[0].who == "admin" and events[0].why == "ramp"
    assert events[1].who == "alice" and events[1].weight is None
    assert await store.arm_events(run_id="run", after_id=first.id) == [second]
    assert await store.arm_events(run_id="run", after_id=second.id) == []
    assert await store.arm_events(run_id="x") == [other]


async def test_a_poller_by_id_misses_no_event_of_concurrent_writers(
    durable_backend_url: str, tmp_path: Path
) -> None:
    """Ids become visible in order: reading `after_id` the newest seen never skips one that a
    slower transaction commits later (PostgreSQL takes them before commit)."""
    from specproxy.control.events import ArmEvent

    writers = [
        open_store(store_config(durable_backend_url, tmp_path / f"w{i}"), run_id="run")
        for i in range(2)
    ]
    reader = open_store(store_config(durable_backend_url, tmp_path / "r"), run_id="run")
    for st in (*writers, reader):
        await st.start()
    seen: list[int] = []
    done = asyncio.Event()

    async def poll() -> None:
        while True:
            finished = done.is_set()
            after = seen[-1] if seen else 0
            seen.extend(e.id for e in await reader.arm_events(run_id="run", after_id=after))
            if finished:
                return
            await asyncio.sleep(0)

    async def write(st: BufferedStore, n: int) -> None:
        for i in range(n):
            await st.add_arm_event(ArmEvent("run", float(i), "set", "speculative", i / 100))

    poller = asyncio.create_task(poll())
    await asyncio.gather(*(write(st, 25) for st in writers for _ in range(2)))
    done.set()
    await poller
    stored = [e.id for e in await reader.arm_events(run_id="run")]
    assert len(stored) == 100 and seen == stored  # each once, none skipped, in id order
    for st in (*writers, reader):
        await st.close()
