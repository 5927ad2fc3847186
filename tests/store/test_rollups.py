"""Rollup tables: additive upserts across batches and replicas, no double count on replays,
retention, on every backend."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specproxy.fleet.models import OTHER, ModelLabels
from specproxy.records import Arm, RequestRecord
from specproxy.store.aggregates import hour_moment_rows
from specproxy.store.buffered import BufferedStore
from specproxy.store.contract import TierRead, TierVersions
from specproxy.store.factory import open_store
from specproxy.summary.blocks import Block
from specproxy.summary.compaction import fold
from specproxy.summary.conditions import CONDITION_METRICS
from specproxy.summary.histogram import coarse_as_fine, coarse_bin
from specproxy.summary.minute import ROLLUP_METRICS, minute_of, rollup_records, usable_for_rollup
from specproxy.summary.packed import fine_bins_arrays
from specproxy.summary.tiering import CompactionBounds
from tests.store.conftest import make_record, store_config
from tests.store.helpers import RollupRows, read_arrays, read_rollups
from tests.summary.helpers import block_entries, merge_batches

T0 = 1_700_000_040.0  # a minute boundary


def at(now: float) -> CompactionBounds:
    """A pass's bounds with 10 fine minutes and 1 hour of 1-minute blocks (the tests' tiers)."""
    return CompactionBounds.at(now, fine_minutes=10, minute_hours=1.0)


def _records(n: int, prefix: str = "r", seed: int = 1) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        e2e = float(rng.lognormal(0.0, 0.5))
        out.append(
            make_record(
                i,
                t_start=T0 + i * 0.7,
                request_id=f"{prefix}-{i}",
                e2e_s=e2e,
                ttft_s=e2e / 4,
                tpot_s=e2e / 100 if i % 5 else None,
                mean_gap_s=e2e / 90 if i % 7 else None,
                model="a" if i % 3 else "b",
                status=200 if i % 17 else 500,
                shadow=i % 11 == 0,
            )
        )
    return out


def _expected(records: list[RequestRecord], metric: str, arm: Arm) -> tuple[dict[int, int], float]:
    batch = rollup_records(records)
    bins: dict[int, int] = {}
    for _run, m, _minute, _model, a, b, c in batch.bins:
        if a == arm and m == metric:
            bins[b] = bins.get(b, 0) + c
    total = sum(s[6] for s in batch.summaries if s[4] == arm and s[1] == metric)
    return bins, total


def _pooled(rows: RollupRows) -> dict[int, int]:
    out: dict[int, int] = {}
    for b, c in zip(rows.bins.tolist(), rows.counts.tolist(), strict=True):
        out[b] = out.get(b, 0) + c
    return out


async def _read(
    store: BufferedStore, metric: str, model: str | None = None
) -> dict[Arm, RollupRows]:
    return await read_rollups(store, run_id="run", metric=metric, model=model)


@contextlib.asynccontextmanager
async def _replicas(
    backend_url: str, tmp_path: Path, records: list[RequestRecord]
) -> AsyncIterator[BufferedStore]:
    """Two replicas sharing one database write `records` alternately (memory:// is per process,
    so there it is one store); yields the first, after both flushed."""
    first = open_store(store_config(backend_url, tmp_path / "a"), run_id="run")
    shared = not backend_url.startswith("memory")
    second = (
        open_store(store_config(backend_url, tmp_path / "b"), run_id="run") if shared else first
    )
    await first.start()
    if shared:
        await second.start()
    try:
        for i, rec in enumerate(records):  # batches of 100, interleaved minutes
            (first if i % 2 else second).record(rec)
        await first.flush()
        await second.flush()
        yield first
    finally:
        await first.close()
        if shared:
            await second.close()


async def _check_fine(store: BufferedStore, records: list[RequestRecord]) -> None:
    """The store's fine rollups of every compared metric are those of `records`."""
    for metric in ROLLUP_METRICS:
        got = await _read(store, metric)
        for arm in ("speculative", "baseline"):
            bins, total = _expected(records, metric, arm)
            assert _pooled(got[arm]) == bins
            assert math.isclose(float(got[arm].total.sum()), total, rel_tol=1e-12)
            assert int(got[arm].n.sum()) == sum(bins.values())


async def test_rollups_of_batches_and_replicas_add_up(backend_url: str, tmp_path: Path) -> None:
    records = _records(600)
    async with _replicas(backend_url, tmp_path, records) as first:
        await _check_fine(first, records)
        # model filter
        only_a = await _read(first, "e2e", model="a")
        bins_a, _ = _expected([r for r in records if r.model == "a"], "e2e", "baseline")
        assert _pooled(only_a["baseline"]) == bins_a


async def test_a_replayed_batch_is_not_rolled_up_twice(store: BufferedStore) -> None:
    records = _records(50)
    for rec in records:
        store.record(rec)
    await store.flush()
    for rec in records[:30]:  # the same rows again (a spill replay), plus new ones
        store.record(rec)
    more = _records(20, prefix="new", seed=2)
    for rec in more:
        store.record(rec)
    await store.flush()
    got = await _read(store, "e2e")
    for arm in ("speculative", "baseline"):
        bins, _ = _expected(records + more, "e2e", arm)
        assert _pooled(got[arm]) == bins


async def test_rollups_are_keyed_by_the_bounded_model_label(store: BufferedStore) -> None:
    """A client that names a new model in every request adds one request row each, but rollup
    keys only under the labels the store's labeller returns; the rows keep the client's string."""
    labels = ModelLabels(["allowed"])
    labels.set_served(["served"])
    store.label_models(labels.label)
    hostile = [f"m-{i}-{'x' * 30}" for i in range(300)]
    named = ["served", "allowed", *hostile]
    for i, model in enumerate(named):
        store.record(make_record(i, t_start=T0 + i * 0.1, arm="baseline", model=model))
    await store.flush()
    rows = await read_arrays(store, run_id="run", columns=("model",))
    assert sorted(rows["baseline"]["model"].tolist()) == sorted(named)
    read = await _full(store)
    assert {model for _minute, model, _arm, *_ in read.minutes} == {"served", "allowed", OTHER}
    assert {model for _minute, model, _arm in read.bins} == {"served", "allowed", OTHER}
    by_model = {model: n for _minute, model, _arm, n, _t, _sq in read.minutes}
    assert by_model == {"served": 1, "allowed": 1, OTHER: len(hostile)}


def _with_tokens(records: list[RequestRecord], hours: float) -> list[RequestRecord]:
    """`records` spread over `hours` hours from T0, with token counts (some without a prompt
    count: those the moments leave out)."""
    step = hours * 3600 / len(records)
    return [
        replace(
            r,
            t_start=T0 + i * step,
            output_tokens=1 + i % 97,
            prompt_tokens=None if i % 19 == 0 else 5 + i % 41,
        )
        for i, r in enumerate(records)
    ]


def _moment_key_rows(rows: list[tuple[Any, ...]]) -> dict[tuple[Any, ...], list[float]]:
    return {tuple(r[:3]): [float(x) for x in r[3:]] for r in rows}


async def test_moments_of_batches_and_replicas_add_up(backend_url: str, tmp_path: Path) -> None:
    """The length adjustment's sums (schema v8): per minute and per hour, equal to those of the
    inserted rows whatever the replicas and batches, a replay not counted twice, retention
    cutting minutes and whole hours."""
    records = _with_tokens(_records(900, prefix="m"), hours=2.5)
    async with _replicas(backend_url, tmp_path, records) as first:
        for rec in records[:100]:  # a replay of rows already stored
            first.record(rec)
        await first.flush()
        want = merge_batches([rollup_records(records)]).moments
        assert want and all(r[4] > 0 for r in want)
        got = await first.read_moments(run_id="run", since_minute=0)
        expect_minutes = _moment_key_rows([r[1:] for r in want])
        expect_hours = _moment_key_rows([r[1:] for r in hour_moment_rows(want)])
        for rows, expect in ((got.minutes, expect_minutes), (got.hours, expect_hours)):
            have = _moment_key_rows(rows)
            assert have.keys() == expect.keys()
            for key, values in expect.items():
                assert have[key] == pytest.approx(values, rel=1e-12), key
        since = minute_of(T0) + 100
        later = await first.read_moments(run_id="run", since_minute=since)
        assert {r[0] for r in later.minutes} == {m for m, *_ in expect_minutes if m >= since}
        assert len(later.hours) == len(got.hours)  # hours are read whole
        # retention at minute T0 + 70: minutes before it go, and the first hour (ended)
        cut = minute_of(T0) + 70
        await first.purge_rollups_older_than(cut * 60.0)
        kept = await first.read_moments(run_id="run", since_minute=0)
        assert {r[0] for r in kept.minutes} == {m for m, *_ in expect_minutes if m >= cut}
        assert {r[0] for r in kept.hours} == {h for h, *_ in expect_hours if h + 60 > cut}


async def test_only_usable_primary_requests_are_rolled_up(store: BufferedStore) -> None:
    store.record(make_record(1, t_start=T0, arm="baseline", e2e_s=1.0))
    store.record(make_record(2, t_start=T0, arm="baseline", e2e_s=2.0, status=503))
    store.record(make_record(3, t_start=T0, arm="baseline", e2e_s=3.0, shadow=True))
    store.record(make_record(4, t_start=T0, arm="baseline", e2e_s=4.0, disconnected=True))
    store.record(make_record(5, t_start=T0, arm="baseline", e2e_s=5.0, error_kind="broken"))
    await store.flush()
    got = (await _read(store, "e2e"))["baseline"]
    assert got.n.tolist() == [1] and got.total.tolist() == [1.0]
    assert got.minute.tolist() == [minute_of(T0)]


async def test_rollup_retention_is_separate_from_row_retention(store: BufferedStore) -> None:
    now = time.time()
    store.record(make_record(1, t_start=now - 10 * 86400, arm="baseline"))
    store.record(make_record(2, t_start=now, arm="baseline"))
    await store.flush()
    await store.purge_older_than(now - 86400)  # rows go, rollups stay
    assert int((await _read(store, "e2e"))["baseline"].n.sum()) == 2
    removed = await store.purge_rollups_older_than(now - 86400)
    # one summary row and one bin row, of e2e and of its one condition (temperature=default)
    assert removed == 4
    assert int((await _read(store, "e2e"))["baseline"].n.sum()) == 1


# -- deferred rollups (schema v13) -----------------------------------------------------------------


@contextlib.asynccontextmanager
async def _deferred(
    backend_url: str, tmp_path: Path, name: str = "p"
) -> AsyncIterator[BufferedStore]:
    """A store whose writes leave the rollups to `fold_pending` (a proxy's)."""
    store = open_store(store_config(backend_url, tmp_path / name, rollups="deferred"), run_id="run")
    await store.start()
    try:
        yield store
    finally:
        await store.close()
        assert store.dropped == 0


async def test_deferred_rows_are_rolled_up_once_by_the_fold_as_inline(
    backend_url: str, tmp_path: Path
) -> None:
    """A deferred write stores the rows and no rollups; one fold adds exactly the rollups an
    inline write adds (bins and counts equal, sums to rounding, moments too); a replay of rows
    already stored, folded or not, is not folded again."""
    records = _with_tokens(_records(600, prefix="d"), hours=1.5)
    async with _deferred(backend_url, tmp_path) as store:
        await _write(store, records[:400])
        assert (await _full(store)).minutes == []
        assert (await store.read_moments(run_id="run", since_minute=0)).minutes == []
        rows = await read_arrays(store, run_id="run", columns=("request_id",))
        assert sum(len(a["request_id"]) for a in rows.values()) == 400
        assert await store.fold_pending() == 400
        await _write(store, records[300:])  # 100 already folded, 200 new
        assert await store.fold_pending() == 200
        assert await store.fold_pending() == 0
        await _check_fine(store, records)
        for metric in CONDITION_METRICS:
            want = merge_batches([rollup_records(records)])
            expect = sorted(
                (m, mo, a, n) for _r, me, m, mo, a, n, *_ in want.summaries if me == metric
            )
            read = await _full(store, metric)
            assert sorted((m, mo, a, n) for m, mo, a, n, _t, _sq in read.minutes) == expect
        want_moments = _moment_key_rows(
            [r[1:] for r in merge_batches([rollup_records(records)]).moments]
        )
        have = _moment_key_rows((await store.read_moments(run_id="run", since_minute=0)).minutes)
        assert have.keys() == want_moments.keys()
        for key, values in want_moments.items():
            assert have[key] == pytest.approx(values, rel=1e-12), key


async def test_folders_at_once_take_each_pending_row_once(
    durable_backend_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stats processes folding one database at the same time, in batches of 7 rows: the rows
    they report add up to the rows written, and the rollups count each row once."""
    for module in ("sqlite", "postgres"):
        monkeypatch.setattr(f"specproxy.store.{module}.FOLD_BATCH_ROWS", 7)
    records = _records(300, prefix="c")
    async with (
        _deferred(durable_backend_url, tmp_path, "w") as writer,
        _deferred(durable_backend_url, tmp_path, "f1") as one,
        _deferred(durable_backend_url, tmp_path, "f2") as two,
    ):
        await _write(writer, records)
        folded = await asyncio.gather(one.fold_pending(), two.fold_pending(), one.fold_pending())
        assert sum(folded) == len(records)
        got = await _read(writer, "e2e")
        for arm in ("speculative", "baseline"):
            assert _pooled(got[arm]) == _expected(records, "e2e", arm)[0]


async def test_the_fold_keys_rollups_by_the_folders_model_label(
    backend_url: str, tmp_path: Path
) -> None:
    """The rows keep the client's model string; the leader's labeller bounds the rollup keys."""
    async with _deferred(backend_url, tmp_path) as store:
        hostile = [f"m-{i}" for i in range(50)]
        for i, model in enumerate(["served", *hostile]):
            store.record(make_record(i, t_start=T0 + i * 0.1, arm="baseline", model=model))
        await store.flush()
        labels = ModelLabels()
        labels.set_served(["served"])
        store.label_models(labels.label)
        assert await store.fold_pending() == 51
        by_model = {model: n for _m, model, _arm, n, _t, _sq in (await _full(store)).minutes}
        assert by_model == {"served": 1, OTHER: 50}


async def test_row_retention_keeps_a_pending_row_until_it_is_folded(
    backend_url: str, tmp_path: Path
) -> None:
    now = time.time()
    async with _deferred(backend_url, tmp_path) as store:
        await _write(store, [make_record(1, t_start=now - 10 * 86400, arm="baseline")])
        assert await store.purge_older_than(now - 86400) == 0
        assert await store.fold_pending() == 1
        assert await store.purge_older_than(now - 86400) == 1
        assert int((await _read(store, "e2e"))["baseline"].n.sum()) == 1


# -- the compacted tier (schema v5) ---------------------------------------------------------------


def _spread(n: int, hours: float, prefix: str, seed: int) -> list[RequestRecord]:
    """`n` records over `hours` hours from T0 (two models, both arms, some unusable)."""
    recs = _records(n, prefix=prefix, seed=seed)
    step = hours * 3600 / n
    return [replace(r, t_start=T0 + i * step) for i, r in enumerate(recs)]


def _coarse_expected(records: list[RequestRecord], metric: str, arm: Arm) -> dict[int, int]:
    bins, _ = _expected(records, metric, arm)
    out: dict[int, int] = {}
    for b, c in bins.items():
        k = int(coarse_as_fine(coarse_bin(np.array([b])))[0])
        out[k] = out.get(k, 0) + c
    return out


def _pooled_tiers(read: TierRead, arm: Arm) -> tuple[dict[int, int], int, float]:
    """Everything a full read holds for one arm, on the coarse grid: histogram, n, sum."""
    hist: dict[int, int] = {}
    n, total = 0, 0.0
    for (start, _span, _model, a), blob in read.blobs.items():
        if a != arm:
            continue
        block = Block.decode(start, blob)
        n += block.n
        total += float(block.minute_total.sum())
        for b, c in zip(*block_entries(block), strict=True):
            hist[int(b)] = hist.get(int(b), 0) + int(c)
    for _minute, _model, a, rows, t, _sq in read.minutes:
        if a == arm:
            n += rows
            total += t
    for (_minute, _model, a), packed in read.bins.items():
        bins, counts = fine_bins_arrays(*packed)
        if a == arm:
            for b, c in zip(
                coarse_as_fine(coarse_bin(bins)).tolist(), counts.tolist(), strict=True
            ):
                hist[b] = hist.get(b, 0) + c
    return hist, n, total


async def _full(store: BufferedStore, metric: str = "e2e") -> TierRead:
    return await store.read_tiers(run_id="run", metric=metric, known=TierVersions())


def _plain(read: TierRead) -> tuple[object, ...]:
    """A read as comparable values (its fine bins unpacked)."""
    bins = {
        k: tuple(a.tolist() for a in fine_bins_arrays(*packed)) for k, packed in read.bins.items()
    }
    return sorted(read.blocks), read.blobs, sorted(read.minutes), bins


def _check_all(read: TierRead, records: list[RequestRecord], metric: str = "e2e") -> None:
    for arm in ("speculative", "baseline"):
        hist, n, total = _pooled_tiers(read, arm)
        expected = _coarse_expected(records, metric, arm)
        assert hist == expected
        assert n == sum(expected.values())
        assert math.isclose(total, _expected(records, metric, arm)[1], rel_tol=1e-9)


@pytest.fixture
async def tiered(backend_url: str, tmp_path: Path) -> AsyncIterator[BufferedStore]:
    """A store of every backend (compacted with `at`'s bounds)."""
    cfg = store_config(backend_url, tmp_path)
    store = open_store(cfg, run_id="run")
    await store.start()
    yield store
    await store.close()


async def _write(store: BufferedStore, records: list[RequestRecord]) -> None:
    for rec in records:
        store.record(rec)
    await store.flush()


async def test_compaction_moves_rows_into_blocks_once_and_loses_nothing(
    tiered: BufferedStore,
) -> None:
    store = tiered
    records = _spread(900, 3.0, "a", 1)
    await _write(store, records)
    now = T0 + 3 * 3600
    assert await store.compact(fold=fold, run_id="run", bounds=at(now)) > 0
    bounds = CompactionBounds.at(now, fine_minutes=10, minute_hours=1.0)
    for metric in ROLLUP_METRICS:
        read = await _full(store, metric)
        _check_all(read, records, metric)
        assert all(m >= bounds.fine_before for m, *_ in read.minutes)  # old fine rows gone
        unpacked = [fine_bins_arrays(*packed)[0] for packed in read.bins.values()]
        assert unpacked and all(np.all(b[1:] > b[:-1]) for b in unpacked)
        spans = {(start < bounds.hours_before, span) for start, span, *_ in read.blocks}
        assert spans == {(True, 60), (False, 1)}  # hours before the bound, minutes after
    # the conditions' rollups, in the same pass: their last hour kept in 1-minute blocks, the
    # rest dropped, never folded into hours
    cut = bounds.conditions_before
    assert cut is not None and bounds.hours_before < cut < bounds.fine_before
    recent = sum(1 for r in records if usable_for_rollup(r) and minute_of(r.t_start) >= cut)
    for metric in CONDITION_METRICS:
        read = await _full(store, metric)
        assert all(m >= bounds.fine_before for m, *_ in read.minutes)
        assert read.blocks and {span for _s, span, *_ in read.blocks} == {1}
        assert min(start for start, *_ in read.blocks) == cut
        if metric == "cond_e2e":  # every usable request states its temperature ("default")
            kept = sum(n for *_k, n in read.blocks) + sum(r[3] for r in read.minutes)
            assert kept == recent
    before = await _full(store)
    assert await store.compact(fold=fold, run_id="run", bounds=at(now)) == 0  # idempotent
    assert _plain(await _full(store)) == _plain(before)
    # a later pass merges the 1-minute blocks that have aged into whole hours
    assert await store.compact(fold=fold, run_id="run", bounds=at(now + 7200)) > 0
    later = await _full(store)
    _check_all(later, records)
    assert {span for _s, span, *_ in later.blocks} == {60}


async def test_late_rows_are_folded_at_the_next_pass_without_double_count(
    tiered: BufferedStore,
) -> None:
    store = tiered
    records = _spread(600, 3.0, "a", 1)
    await _write(store, records)
    now = T0 + 3 * 3600
    await store.compact(fold=fold, run_id="run", bounds=at(now))
    known = await _full(store)
    versions = TierVersions(
        {(s, sp, m, a): n for s, sp, m, a, n in known.blocks},
        {(mi, mo, a): n for mi, mo, a, n, _t, _s in known.minutes},
    )
    unchanged = await store.read_tiers(run_id="run", metric="e2e", known=versions)
    assert unchanged.blobs == {} and unchanged.bins == {}  # nothing new: keys only
    late = _spread(120, 1.5, "late", 2)  # requests of the first 90 minutes, written now
    await _write(store, late)
    read = await _full(store)
    _check_all(read, records + late)  # seen at once, as fine rows beside the blocks
    assert any(m < now // 60 - 10 for m, *_ in read.minutes)
    assert await store.compact(fold=fold, run_id="run", bounds=at(now)) > 0
    folded = await _full(store)
    _check_all(folded, records + late)
    assert all(m >= now // 60 - 10 for m, *_ in folded.minutes)
    changed = await store.read_tiers(run_id="run", metric="e2e", known=versions)
    # only the hour blocks the late rows fell in are read again
    assert {(s, sp) for s, sp, *_ in changed.blobs} == {
        (s, sp) for s, sp, m, a, n in folded.blocks if versions.blocks.get((s, sp, m, a)) != n
    }
    assert all(sp == 60 and s < (T0 + 2 * 3600) // 60 for s, sp, *_ in changed.blobs)


async def test_rollup_retention_removes_old_blocks(tiered: BufferedStore) -> None:
    store = tiered
    await _write(store, _spread(300, 3.0, "a", 1))
    await store.compact(fold=fold, run_id="run", bounds=at(T0 + 3 * 3600))
    cut = T0 + 3600 * 2
    await store.purge_rollups_older_than(cut)
    read = await _full(store)
    assert read.blocks and all(s + sp > cut // 60 for s, sp, *_ in read.blocks)
    assert all(m >= cut // 60 for m, *_ in read.minutes)
