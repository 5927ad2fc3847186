"""The job's incremental rollup cache: a warm cache holds exactly what a cold read gets, across
writes, late rows and compaction passes, so warm and cold ticks give the same result; and the
rollup path after compaction agrees with the exact values within the bound it states."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.records import RequestRecord
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS
from specproxy.stats.job import tick
from specproxy.stats.job.cache import RollupCache
from specproxy.stats.job.tick import compute_stats
from specproxy.store.buffered import BufferedStore
from specproxy.store.contract import TierVersions
from specproxy.store.factory import open_store
from specproxy.summary.compaction import fold
from specproxy.summary.conditions import CONDITION_METRICS
from specproxy.summary.grid import COARSE_ERROR_BOUND
from specproxy.summary.minute import ROLLUP_METRICS, STORED_METRICS, usable_for_rollup
from specproxy.summary.tiering import CONDITION_MINUTES, CompactionBounds
from tests.stats.oracles import adjusted_hc3

RUN = "r"
M0 = 1_000_000  # first minute (a whole hour)
NO_WARMUP = WarmupConfig(requests=0, restart_requests=0, restart_seconds=0.0)


def at(now: float) -> CompactionBounds:
    """A pass's bounds with 10 fine minutes and 1 hour of 1-minute blocks (the tests' tiers)."""
    return CompactionBounds.at(now, fine_minutes=10, minute_hours=1.0)


def _records(first: int, minutes: int, per_minute: int, prefix: str) -> list[RequestRecord]:
    rng = np.random.default_rng(first)
    out = []
    for i in range(minutes * per_minute):
        arm = "speculative" if i % 2 else "baseline"
        e2e = float(rng.lognormal(0.0 if arm == "baseline" else -0.2, 0.5))
        out.append(
            RequestRecord(
                request_id=f"{prefix}{i}",
                run_id=RUN,
                arm=arm,
                t_start=(first + i / per_minute) * 60.0,
                model="a" if i % 3 else "b",
                endpoint="completions",
                stream=True,
                status=200 if i % 13 else 500,
                e2e_s=e2e,
                upstream_s=e2e,
                ttft_s=e2e / 4,
                tpot_s=e2e / 100 if i % 7 else None,
                prompt_tokens=20,
                output_tokens=100,
                endpoint_in_flight=1 + (i // 2) % 5,  # the conditions (`summary.conditions`)
                temperature=0.7 if i % 4 < 2 else None,
                category=("code", "chat", "math")[(i // 2) % 3],
            )
        )
    return out


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BufferedStore]:
    url = "memory://" if request.param == "memory" else f"sqlite:///{tmp_path}/s.db"
    cfg = StoreConfig(
        url=url,
        spill_path=str(tmp_path / "spill.jsonl"),
    )
    s = open_store(cfg, run_id=RUN)
    await s.start()
    yield s
    await s.close()


def _canonical(cache: RollupCache) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for metric, per_arm in cache.tiers.items():
        for arm, tier in per_arm.items():
            out[f"{metric}/{arm}/blocks"] = sorted(
                (k, b.lo, b.counts.tolist(), b.minute_n.tolist(), b.minute_total.tolist())
                for k, b in tier.blocks.items()
            )  # fmt: skip
            out[f"{metric}/{arm}/fine"] = sorted(
                (k, f.n, f.total, sorted(zip(f.bins.tolist(), f.counts.tolist(), strict=True)))
                for k, f in tier.fine.items()
            )
    return out


async def _cold(store: BufferedStore) -> RollupCache:
    cache = RollupCache()
    await cache.refresh(store, RUN, STORED_METRICS)
    return cache


async def _write(store: BufferedStore, records: list[RequestRecord]) -> None:
    for rec in records:
        store.record(rec)
    await store.flush()


async def test_a_warm_cache_holds_what_a_cold_read_gets(store: BufferedStore) -> None:
    warm = RollupCache()
    await warm.refresh(store, RUN, STORED_METRICS)
    for step in range(4):
        first = M0 + 50 * step
        await _write(store, _records(first, 50, 4, f"s{step}-"))
        if step:  # late rows for minutes compacted at an earlier pass
            await _write(store, _records(M0 + 3 * step, 5, 2, f"late{step}-"))
        await store.compact(fold=fold, run_id=RUN, bounds=at((first + 50) * 60.0))
        await warm.refresh(store, RUN, STORED_METRICS)
        cold = await _cold(store)
        assert _canonical(warm) == _canonical(cold), step
        if step:
            assert warm.rows_read < cold.rows_read  # only what changed was read
    assert any(span == 60 for start, span, _ in warm.tiers["e2e"]["baseline"].blocks)
    # the conditions' rollups, keyed by condition, are kept an hour in 1-minute blocks
    conditions = warm.tiers["cond_tpot"]["baseline"]
    assert conditions.blocks and {span for _s, span, _k in conditions.blocks} == {1}
    assert {key for _s, _sp, key in conditions.blocks} >= {"load=1", "load=5", "category=math"}


def _stable(result: Any) -> str:
    """The result without its clock fields, floats to 12 digits (sums may add in other orders)."""
    for key in ("computed_at", "duration_s", "lag_s"):
        result.pop(key, None)
    return json.dumps(_round(result), sort_keys=True)


def _round(x: Any) -> Any:
    if isinstance(x, float):
        return float(f"{x:.12g}") if math.isfinite(x) else str(x)
    if isinstance(x, dict):
        return {k: _round(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_round(v) for v in x]
    return x


async def test_warm_and_cold_ticks_give_the_same_result(
    store: BufferedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tick, "ROWS_MAX", 100)
    cfg = StatsConfig(windows_s=(300.0, 3600.0, None), resamples=200)
    warm = RollupCache()
    for step in range(3):
        first = M0 + 60 * step
        await _write(store, _records(first, 60, 4, f"s{step}-"))
        now = (first + 60) * 60.0
        await store.compact(fold=fold, run_id=RUN, bounds=at(now))
        kwargs: dict[str, Any] = {"run_id": RUN, "stats_cfg": cfg, "warmup": NO_WARMUP}
        hot = await compute_stats(store, window_end=now, cache=warm, **kwargs)
        cold = await compute_stats(store, window_end=now, **kwargs)
        assert hot["results"]["all"]["all"].get("source") == "summaries"
        assert _stable(hot) == _stable(cold)


async def _compacted_run(
    store: BufferedStore, monkeypatch: pytest.MonkeyPatch
) -> tuple[list[RequestRecord], Any]:
    """Three hours of requests, compacted (hour and minute blocks, fine minutes), and the
    whole-run window of all models as read from the summaries."""
    monkeypatch.setattr(tick, "ROWS_MAX", 0)
    records = _records(M0 + 7, 180, 20, "x")
    await _write(store, records)
    now = (M0 + 187) * 60.0
    await store.compact(fold=fold, run_id=RUN, bounds=at(now))
    cfg = StatsConfig(windows_s=(None,), resamples=200)
    result = await compute_stats(store, run_id=RUN, stats_cfg=cfg, warmup=NO_WARMUP, window_end=now)
    return records, result["results"]["all"]["all"]


async def test_compacted_windows_agree_with_the_exact_values_within_the_stated_bound(
    store: BufferedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    records, window = await _compacted_run(store, monkeypatch)
    assert window["grid_error_bound"] == COARSE_ERROR_BOUND
    assert window["span"][0] % 3600 == 0  # widened to whole hours
    half = math.log1p(COARSE_ERROR_BOUND) / 2
    for metric, attr in ROLLUP_METRICS.items():
        if metric not in window["metrics"]:
            continue  # summarised, not compared ("step": the diagnosis reads its median)
        block = window["metrics"][metric]
        assert block["time_blocks"]["block_units"] % 60 == 0
        exact: dict[str, dict[str, float]] = {}
        for arm in ("speculative", "baseline"):
            values = np.sort(
                [
                    getattr(r, attr)
                    for r in records
                    if r.arm == arm and usable_for_rollup(r) and getattr(r, attr) is not None
                ]
            )
            assert block["n"][arm] == values.size
            exact[arm] = {"mean": float(values.mean())}
            for stat, p in QUANTILE_LEVELS.items():
                got = block["summary"][arm][stat]
                want = float(np.quantile(values, p))
                exact[arm][stat] = want
                assert abs(math.log(got / want)) <= half + 1e-12, (metric, arm, stat)
            assert block["summary"][arm]["mean"] == pytest.approx(values.mean(), rel=1e-9)
        for stat, speed in block["speedup"].items():
            want = exact["baseline"][stat] / exact["speculative"][stat]
            assert abs(math.log(speed["estimate"] / want)) <= math.log1p(COARSE_ERROR_BOUND) + 1e-9
    # the length adjustment of a window of hour blocks, from the hour moment rows: the rows'
    cols = {
        arm: {
            a: np.array(
                [float(getattr(r, a)) for r in records if r.arm == arm and usable_for_rollup(r)]
            )
            for a in ("e2e_s", "output_tokens", "prompt_tokens")
        }
        for arm in ("speculative", "baseline")
    }
    b, sp = cols["baseline"], cols["speculative"]
    rows_adj = adjusted_hc3(
        b["e2e_s"], b["output_tokens"], sp["e2e_s"], sp["output_tokens"],
        baseline_prompt_tokens=b["prompt_tokens"], speculative_prompt_tokens=sp["prompt_tokens"],
    )  # fmt: skip
    adj = window["metrics"]["e2e"]["adjusted"]
    reliable = window["metrics"]["e2e"]["time_blocks"]["reliable"]  # 4 hour blocks: False
    assert rows_adj is not None and adj is not None
    assert adj["method"] == ("block" if reliable else "iid")
    assert adj["estimate"] == pytest.approx(rows_adj[0], rel=1e-9)
    assert adj["n"] == b["e2e_s"].size + sp["e2e_s"].size


async def test_a_large_run_s_speedups_by_condition_come_from_its_compacted_summaries(
    store: BufferedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 26: a run read from its summaries gets its speedups by condition from the
    condition keys, which compaction keeps for `CONDITION_MINUTES` (1-minute blocks and fine
    minutes, never hour blocks): each band holds exactly the usable requests of that last hour
    that met it, and its median speedup is within the coarse grid's bound of the exact ratio."""
    records, window = await _compacted_run(store, monkeypatch)
    assert window["source"] == "summaries" and window["grid_error_bound"] == COARSE_ERROR_BOUND
    conditions = window["conditions"]
    assert conditions is not None and conditions["window_s"] == CONDITION_MINUTES * 60
    since = (M0 + 187 - CONDITION_MINUTES) * 60.0  # the window ends at minute M0 + 187
    for metric in CONDITION_METRICS:  # what compaction left of the conditions' rollups
        read = await store.read_tiers(run_id=RUN, metric=metric, known=TierVersions())
        assert read.blocks and {span for _s, span, *_ in read.blocks} == {1}
        assert min(s for s, *_ in read.blocks) == M0 + 187 - CONDITION_MINUTES
    usable = [r for r in records if usable_for_rollup(r) and r.t_start >= since]
    bands_of: dict[str, Callable[[RequestRecord], str | None]] = {
        "load": lambda r: {1: "1", 2: "2-3", 3: "2-3"}.get(r.endpoint_in_flight or 0, "4-7"),
        "temperature": lambda r: "(0.5,1]" if r.temperature == 0.7 else "default",
        "category": lambda r: r.category,
        "output": lambda r: "32-127",
        "prompt": lambda r: "<128",
    }
    for dim, band_of in bands_of.items():
        for metric, attr in (("e2e", "e2e_s"), ("tpot", "tpot_s")):
            bands = conditions["segments"][dim][metric]
            assert bands, (dim, metric)
            for band in bands:
                values = {
                    arm: np.array(
                        [
                            getattr(r, attr)
                            for r in usable
                            if r.arm == arm
                            and getattr(r, attr) is not None
                            and band_of(r) == band["band"]
                        ]
                    )
                    for arm in ("baseline", "speculative")
                }
                assert band["n"] == {
                    "control": values["baseline"].size,
                    "treatment": values["speculative"].size,
                }, (dim, band["band"], metric)
                assert band["status"] == "ok"
                want = float(np.median(values["baseline"]) / np.median(values["speculative"]))
                got = band["speedup"]
                assert abs(math.log(got / want)) <= math.log1p(COARSE_ERROR_BOUND) + 1e-9
    crossover = conditions["crossover"]["tpot"]
    assert crossover["status"] == "helps_throughout"  # 1.2x faster at every load
    assert [g["load"] for g in crossover["groups"]] == [1.0, 2.0, 3.0, 4.0, 5.0]


async def test_decoding_runs_on_the_given_executor_not_the_event_loop(
    store: BufferedStore,
) -> None:
    await _write(store, _records(M0, 3, 4, "d"))
    cache = RollupCache()
    threads: list[str] = []
    apply = cache.apply

    def recording_apply(metric: str, read: Any) -> None:
        threads.append(threading.current_thread().name)
        apply(metric, read)

    cache.apply = recording_apply  # type: ignore[method-assign]
    with ThreadPoolExecutor(1, thread_name_prefix="decoder") as pool:
        await cache.refresh(store, RUN, STORED_METRICS, executor=pool)
    assert len(threads) == len(STORED_METRICS)
    assert all(name.startswith("decoder") for name in threads)
    assert _canonical(cache) == _canonical(await _cold(store))
    assert cache.read_s > 0 and cache.decode_s > 0


async def test_a_refresh_reads_the_other_metrics_only_when_the_first_ones_counts_say_so(
    store: BufferedStore,
) -> None:
    """`go_on` sees the first metric's requests per arm as the tiers will hold them (blocks and
    fine minutes, compacted or not), and a refused `go_on` leaves the other metrics unread."""
    await _write(store, _records(M0, 90, 20, "g"))
    await store.compact(
        fold=fold, run_id=RUN, bounds=at((M0 + 85) * 60.0)
    )  # hour and minute blocks
    seen: list[dict[str, int]] = []

    def refuse(requests: dict[str, int]) -> bool:
        seen.append(requests)
        return False

    cache = RollupCache()
    await cache.refresh(store, RUN, tuple(ROLLUP_METRICS), go_on=refuse)
    first = next(iter(ROLLUP_METRICS))
    assert seen == [{arm: cache.tiers[first][arm].n for arm in ("speculative", "baseline")}]
    assert all(v > 0 for v in seen[0].values())
    assert all(t.n == 0 for m in ROLLUP_METRICS if m != first for t in cache.tiers[m].values())
    assert any(t.blocks for t in cache.tiers[first].values())  # the counts included blocks
    await cache.refresh(store, RUN, STORED_METRICS, go_on=lambda _requests: True)
    assert _canonical(cache) == _canonical(await _cold(store))
