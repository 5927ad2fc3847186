"""The job switches from rows to rollups above `stats.raw_rows_max`, with the same schema; warm-up
minutes; freshness fields on both paths."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest

from specproxy.config import ScrapeConfig, StatsConfig, StoreConfig
from specproxy.records import Arm, EngineSample, RequestRecord
from specproxy.stats.compare import REQUIRED_COLUMNS
from specproxy.stats.job.cache import ArmTier, FineMinute, RollupCache
from specproxy.stats.job.rollups import (
    _Span,
    _window_blocks,
    compute_from_rollups,
    models_by_label,
    tick_reads,
    warmup_minutes,
)
from specproxy.stats.job.runner import compute_from_arrays, compute_stats, window_label
from specproxy.store.memory import MemoryStore
from specproxy.summary.blocks import Block
from specproxy.summary.histogram import coarse_as_fine, coarse_bin
from specproxy.summary.minute import ROLLUP_METRICS, rollup_records
from tests.store.helpers import read_arrays, rollup_rows_from
from tests.summary.test_engine import random_engine_samples

RUN = "r"
T0 = 60_000.0  # minute 1000


def _records(minutes: int, per_minute: int, seed: int = 0) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    n = minutes * per_minute
    for i in range(n):
        arm = Arm.SPECULATIVE if i % 2 else Arm.BASELINE
        tpot = float(rng.lognormal(np.log(0.02), 0.3)) / (1.5 if arm is Arm.SPECULATIVE else 1.0)
        out.append(
            RequestRecord(
                request_id=f"q{i}",
                run_id=RUN,
                arm=arm,
                t_start=T0 + i * 60.0 / per_minute,
                model="m",
                endpoint="completions",
                stream=True,
                status=200,
                e2e_s=0.1 + 100 * tpot,
                upstream_s=0.1 + 100 * tpot,
                ttft_s=0.1,
                tpot_s=tpot,
                prompt_tokens=20,
                output_tokens=101,
            )
        )
    return out


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for rec in _records(minutes=40, per_minute=60):
        s.record(rec)
    await s.flush()
    yield s
    await s.close()


SCRAPE = ScrapeConfig(warmup_requests=0, warmup_seconds=0.0)


async def test_small_runs_use_rows_and_big_ones_rollups_with_one_schema(store: MemoryStore) -> None:
    end = T0 + 40 * 60
    rows = await compute_stats(
        store,
        run_id=RUN,
        stats_cfg=StatsConfig(windows_s=(600.0, None), resamples=200, warmup_requests=0),
        scrape_cfg=SCRAPE,
        window_end=end,
    )
    small_limit = StatsConfig(
        windows_s=(600.0, None), resamples=200, warmup_requests=0, raw_rows_max=1000
    )
    rolled = await compute_stats(
        store, run_id=RUN, stats_cfg=small_limit, scrape_cfg=SCRAPE, window_end=end
    )
    assert rows["source"] == "rows" and rolled["source"] == "rollups"
    assert set(rolled) == set(rows)
    for label in ("10m", "all"):
        r, w = rows["results"]["all"][label], rolled["results"]["all"][label]
        if label == "all":
            assert r["samples"] == w["samples"] == {"baseline": 1200, "speculative": 1200}
        for metric in ("e2e", "tpot"):
            for stat in ("median", "mean", "p90"):
                a = r["metrics"][metric]["speedup"][stat]
                b = w["metrics"][metric]["speedup"][stat]
                assert b["estimate"] == pytest.approx(a["estimate"], rel=0.02), (label, stat)
            assert r["metrics"][metric]["verdict"] == w["metrics"][metric]["verdict"] == "faster"
    json.dumps(rolled, allow_nan=False)


async def test_results_carry_their_data_horizon_and_lag(store: MemoryStore) -> None:
    cfg = StatsConfig(windows_s=(None,), resamples=100, warmup_requests=0)
    for limit in (10**9, 100):
        result = await compute_stats(
            store,
            run_id=RUN,
            stats_cfg=StatsConfig(
                windows_s=cfg.windows_s, resamples=100, warmup_requests=0, raw_rows_max=limit
            ),
            scrape_cfg=SCRAPE,
        )
        last_start = T0 + (40 * 60 - 1) * 1.0
        if result["source"] == "rows":
            assert result["data_horizon"] == pytest.approx(last_start)
        else:  # the end of the last minute holding data
            assert result["data_horizon"] == T0 + 40 * 60
        horizon = result.get("data_horizon")
        assert horizon is not None
        assert result.get("lag_s") == pytest.approx(result["computed_at"] - horizon)


def test_warmup_minutes_cover_the_first_requests_and_each_restart() -> None:
    recs = _records(minutes=10, per_minute=10)  # 5 per arm per minute
    batch = rollup_records(recs)
    minutes = [
        (s[2], s[5], s[6], s[7]) for s in batch.summaries if s[4] == "baseline" and s[1] == "e2e"
    ]
    rows = rollup_rows_from(minutes, [])
    per_minute = (rows.minute, rows.n)
    first = 1000
    assert warmup_minutes(
        *per_minute, [], warmup_requests=7, restart_requests=0, restart_seconds=0
    ) == {
        first,
        first + 1,
    }
    got = warmup_minutes(
        *per_minute, [T0 + 4 * 60 + 10], warmup_requests=0, restart_requests=6, restart_seconds=0
    )
    assert got == {first + 4, first + 5}
    got = warmup_minutes(
        *per_minute, [T0 + 4 * 60 + 10], warmup_requests=0, restart_requests=1, restart_seconds=150
    )
    assert got == {first + 4, first + 5, first + 6}


async def test_rollup_path_excludes_restart_minutes(store: MemoryStore) -> None:
    store.record_engine(EngineSample(T0 + 600, RUN, Arm.SPECULATIVE, True))
    store.record_engine(EngineSample(T0 + 610, RUN, Arm.SPECULATIVE, True, restarted=True))
    await store.flush()
    cfg = StatsConfig(windows_s=(None,), resamples=100, warmup_requests=0, raw_rows_max=10)
    result = await compute_stats(
        store,
        run_id=RUN,
        stats_cfg=cfg,
        scrape_cfg=ScrapeConfig(warmup_requests=1, warmup_seconds=0),
    )
    res = result["results"]["all"]["all"]
    assert res["excluded_warmup"]["baseline"] == 0
    assert res["excluded_warmup"]["speculative"] == 30  # one whole minute


def test_window_entries_are_every_occupied_bin_of_the_chosen_blocks_and_fine_minutes() -> None:
    """`_window_blocks` against a plain per-bin loop: blocks with empty dense bins, an empty
    block, a block holding an excluded minute, a fine minute with a zero count; entries in
    block order then fine order, each coarse bin at its centre fine bin."""
    rng = np.random.default_rng(5)
    tier = ArmTier()
    hour = 600  # minute of an hour boundary
    for start, width in ((hour, 60), (hour + 60, 1), (hour + 61, 1), (hour + 62, 1)):
        k = 0 if start == hour + 61 else int(rng.integers(3, 9))
        counts = rng.integers(0, 3, k)  # zeros inside: empty coarse bins
        n = np.zeros(width, dtype=np.int64)
        n[0] = int(counts.sum())
        tier.blocks[(start, width, "m")] = Block(
            start,
            width,
            n,
            n.astype(np.float64),
            n.astype(np.float64),
            int(rng.integers(-40, 40)),
            counts,
        )
    tier.fine[(hour + 63, "m")] = FineMinute(3, 3.0, 3.0, np.array([-7, 2, 9]), np.array([1, 0, 2]))
    tier.fine[(hour + 64, "m")] = FineMinute(1, 1.0, 1.0, np.array([40]), np.array([1]))
    span = _Span(hour, hour + 64, hourly=True, coarse=True)
    blocks, dropped = _window_blocks(tier, span, excluded={hour + 62})
    want_unit, want_bin, want_count = [], [], []
    for (start, _w, _m), b in tier.blocks.items():
        if start == hour + 62:
            continue  # holds an excluded minute: left out whole
        for i, c in enumerate(b.counts.tolist()):
            if c:
                want_unit.append(start - hour)
                want_bin.append(int(coarse_as_fine(np.array([b.lo + i]))[0]))
                want_count.append(c)
    for (minute, _m), f in tier.fine.items():
        for b, c in zip(f.bins.tolist(), f.counts.tolist(), strict=True):
            if c:
                want_unit.append(minute - hour)
                want_bin.append(int(coarse_as_fine(coarse_bin(np.array([b])))[0]))
                want_count.append(c)
    assert blocks.unit.tolist() == want_unit
    assert blocks.bins.tolist() == want_bin
    assert blocks.counts.tolist() == want_count
    assert dropped == tier.blocks[(hour + 62, 1, "m")].n
    assert blocks.n == sum(b.n for b in tier.blocks.values()) + 4 - dropped


@pytest.mark.parametrize("raw_rows_max", [1000, 1_000_000])  # rollups, rows
async def test_a_tick_reads_engine_aggregates_with_the_results_of_every_sample(
    store: MemoryStore, raw_rows_max: int
) -> None:
    """compute_stats reads the store's engine aggregates and restart samples (`engineagg`), not
    every sample: its result equals the computation fed every stored sample, restarts (warm-up
    exclusion) and engine summaries included, on both paths."""
    shift = T0 - 1000.0 + 30.0
    samples = [
        dataclasses.replace(s, t=s.t + shift, run_id=RUN)
        for s in random_engine_samples(3, n=600, replicas=2)  # 1000 s, both arms
    ]
    for s in samples:
        store.record_engine(s)
    await store.flush()
    assert any(s.restarted and s.up for s in samples)
    cfg = StatsConfig(
        windows_s=(300.0, 1800.0, None), resamples=100, warmup_requests=5, raw_rows_max=raw_rows_max
    )
    scrape = ScrapeConfig(warmup_requests=3, warmup_seconds=20.0)
    end = T0 + 40 * 60
    got = await compute_stats(store, run_id=RUN, stats_cfg=cfg, scrape_cfg=scrape, window_end=end)
    stored = await store.read_engine_samples(run_id=RUN)
    if raw_rows_max == 1000:
        cache = RollupCache()
        await cache.refresh(store, RUN, tuple(ROLLUP_METRICS))
        since = tick_reads(cache.tiers, cfg.windows_s, end).moments_from
        want: dict[str, Any] = compute_from_rollups(
            cache.tiers,
            stored,
            windows=[(w, window_label(w)) for w in cfg.windows_s],
            stats_cfg=cfg,
            scrape_cfg=scrape,
            window_end=end,
            moments=await store.read_moments(run_id=RUN, since_minute=since),
        ).results
    else:
        arrays = await read_arrays(store, run_id=RUN, columns=REQUIRED_COLUMNS)
        want = compute_from_arrays(
            arrays, stored, run_id=RUN, stats_cfg=cfg, scrape_cfg=scrape, window_end=end
        )["results"]
    assert got["source"] == ("rollups" if raw_rows_max == 1000 else "rows")
    assert got["results"] == want
    whole = got["results"]["all"]["all"]
    assert whole["engine"]["speculative"]["restarts"] > 0
    assert sum(whole["excluded_warmup"].values()) > 10


def _two_models(minutes: int = 40, per_minute: int = 60) -> list[RequestRecord]:
    """Model "a": speculation 1.5x faster per token; model "b" (every third request): 1.25x
    slower."""
    out = []
    for i, rec in enumerate(_records(minutes, per_minute, seed=3)):
        if i % 6 in (0, 1):  # a third of each arm's requests
            slow = 1.25 if rec.arm is Arm.SPECULATIVE else 1 / 1.5
            tpot = (rec.tpot_s or 0.0) * (1.5 if rec.arm is Arm.SPECULATIVE else 1.0) * slow
            e2e = 0.1 + 100 * tpot
            rec = dataclasses.replace(rec, model="b", tpot_s=tpot, e2e_s=e2e, upstream_s=e2e)
        else:
            rec = dataclasses.replace(rec, model="a")
        out.append(rec)
    return out


async def test_rollups_give_per_model_results_like_rows() -> None:
    """Per model on both paths: the same models, summaries and verdicts (speculation helps "a" and
    hurts "b"), estimates within the grid bound's reach of each other; a model the labeller no
    longer keeps is compared under "other", as on rows."""
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for rec in _two_models():
        s.record(rec)
    await s.flush()
    end = T0 + 40 * 60
    windows = (600.0, None)
    base = StatsConfig(windows_s=windows, resamples=200, warmup_requests=0)
    rolled_cfg = dataclasses.replace(base, raw_rows_max=1000)
    rows = await compute_stats(s, run_id=RUN, stats_cfg=base, scrape_cfg=SCRAPE, window_end=end)
    rolled = await compute_stats(
        s, run_id=RUN, stats_cfg=rolled_cfg, scrape_cfg=SCRAPE, window_end=end
    )
    assert (rows["source"], rolled["source"]) == ("rows", "rollups")
    assert set(rolled["results"]) == set(rows["results"]) == {"all", "a", "b"}
    for model, verdict in (("a", "faster"), ("b", "slower")):
        for label in ("10m", "all"):
            r, w = rows["results"][model][label], rolled["results"][model][label]
            assert r["samples"] == w["samples"], (model, label)
            for stat in ("median", "mean", "p90"):
                a = r["metrics"]["tpot"]["speedup"][stat]["estimate"]
                b = w["metrics"]["tpot"]["speedup"][stat]["estimate"]
                assert b == pytest.approx(a, rel=0.01), (model, label, stat)
        rolled_adj = rolled["results"][model]["all"]["metrics"]["e2e"]["adjusted"]
        rows_adj = rows["results"][model]["all"]["metrics"]["e2e"]["adjusted"]
        assert rolled_adj is not None and rows_adj is not None
        assert rolled_adj["estimate"] == pytest.approx(rows_adj["estimate"], rel=1e-9)
        assert rolled["results"][model]["all"]["metrics"]["tpot"]["verdict"] == verdict
        assert rows["results"][model]["all"]["metrics"]["tpot"]["verdict"] == verdict
    whole = rolled["results"]
    assert (
        whole["a"]["all"]["samples"]["baseline"] + whole["b"]["all"]["samples"]["baseline"]
        == (whole["all"]["all"]["samples"]["baseline"])
    )
    relabelled = await compute_stats(
        s,
        run_id=RUN,
        stats_cfg=rolled_cfg,
        scrape_cfg=SCRAPE,
        window_end=end,
        model_label=lambda m: m if m == "a" else "other",
    )
    assert set(relabelled["results"]) == {"all", "a", "other"}
    assert relabelled["results"]["other"]["all"]["samples"] == whole["b"]["all"]["samples"]
    await s.close()


def test_a_single_model_run_reuses_the_all_result_on_rollups() -> None:
    tier = ArmTier()
    tier.fine[(1000, "m")] = FineMinute(1, 1.0, 1.0, np.array([5]), np.array([1]))
    tiers = {metric: {arm: tier for arm in Arm} for metric in ROLLUP_METRICS}
    assert models_by_label(tiers, None) == {"m": frozenset({"m"})}
    assert models_by_label(tiers, lambda m: "other") == {"other": frozenset({"m"})}
    result = compute_from_rollups(
        tiers,
        [],
        windows=[(None, "all")],
        stats_cfg=StatsConfig(windows_s=(None,), resamples=100, warmup_requests=0),
        scrape_cfg=SCRAPE,
        window_end=T0 + 60,
    ).results
    assert set(result) == {"all", "m"}
    assert result["m"] == result["all"] and result["m"] is not result["all"]
