"""One tick: every window of every model from a run's rows or summaries, as `compute_stats` reads
them from a store."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.fleet.models import OTHER, ModelLabels
from specproxy.records import EngineSample, GpuSample, RequestRecord
from specproxy.scrape.dcgmloop import GpuScraper
from specproxy.stats.job import tick
from specproxy.stats.job.tick import compute_stats, configs_of, result_settings, window_label
from specproxy.store.memory import MemoryStore
from specproxy.summary.engine import SampleView
from specproxy.summary.grid import COARSE_ERROR_BOUND, GRID_ERROR_BOUND
from tests.stats.job.runs import (
    CFG,
    RUN,
    T0,
    WARMUP,
    hot_gpu_config,
    minute_records,
    records,
    typo_404,
)
from tests.summary.test_engine import random_engine_samples


def test_window_labels() -> None:
    assert [window_label(w) for w in (300.0, 3600.0, None, 90.0, 86400.0)] == [
        "5m",
        "1h",
        "all",
        "90s",
        "1d",
    ]


async def test_compute_stats_end_to_end(store: MemoryStore) -> None:
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, window_end=1160.0)
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
    # a sliding window of rows starts on a clock minute (units nest in minutes): 1080..1160
    assert last_minute.get("span") == [1080.0, 1161.0]
    whole = result["results"]["m-a"]["all"]["samples"]["baseline"]
    assert 0 < last_minute["samples"]["baseline"] < whole
    assert last_minute["metrics"]["e2e"]["speedup"]["p99"]["status"] == "insufficient"
    json.dumps(result, allow_nan=False)  # JSON-able, no NaN


async def test_per_model_results_are_bounded_by_the_model_labels(store: MemoryStore) -> None:
    labels = ModelLabels(allow=["m-a"])  # m-b is served by no arm: it becomes "other"
    for i in range(50):  # a client inventing model names
        store.record(
            RequestRecord(
                f"x{i}",
                RUN,
                "baseline",
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
        warmup=WARMUP,
        window_end=1160.0,
        model_label=labels.label,
    )
    assert set(result["results"]) == {"all", "m-a", OTHER}
    assert len(result["results"]) <= labels.bound + 1  # + "all"
    other = result["results"][OTHER]["all"]["samples"]
    plain = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, window_end=1160.0)
    assert len(plain["results"]) == 3 + 50  # unbounded without the labels
    assert other["baseline"] == plain["results"]["m-b"]["all"]["samples"]["baseline"] + 50


@pytest.mark.parametrize("source", ["rows", "summaries"])
async def test_gpu_telemetry_scraped_end_to_end_reaches_the_diagnosis(
    store: MemoryStore,
    aiohttp_server: AiohttpServer,
    source: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A fake dcgm-exporter (port 0) serving the derived hot page: GPU 0 at DRAM active 0.95 with
    # reasons sw_thermal|hw_thermal. Only the speculative arm has telemetry. The scraper records
    # into the store and the job reads the samples back from it (no in-memory hand-over).
    cfg = await hot_gpu_config(aiohttp_server)
    now = [0.0]
    async with aiohttp.ClientSession() as session:
        scraper = GpuScraper(
            cfg, {arm: session for arm in ("speculative", "baseline")}, store, clock=lambda: now[0]
        )
        for t in (1020.0, 1120.0, 1150.0):
            now[0] = t
            await scraper.scrape_once()
    await store.flush()
    if source == "summaries":
        monkeypatch.setattr(tick, "ROWS_MAX", 0)
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, window_end=1160.0)
    for window, scrapes in (("1m", 2), ("all", 3)):
        res = result["results"]["all"][window]
        assert res.get("source") == source
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
    monkeypatch.setattr(tick, "GPU_SAMPLES_READ", 2)
    for t, hot in ((1000.0, True), (1010.0, True), (1020.0, True), (1030.0, False)):
        store.record_gpu(GpuSample(t=t, arm="baseline", up=True, run_id=RUN, thermal_throttled=hot))
    store.record_gpu(GpuSample(t=1000.0, arm="baseline", up=True, run_id="other"))
    await store.flush()
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    gpu = result["results"]["all"]["all"]["engine"]["baseline"]["gpu"]
    assert gpu is not None and gpu["samples"] == 2 and gpu["thermal_throttle_share"] == 0.5
    assert result["results"]["all"]["all"]["engine"]["speculative"]["gpu"] is None


async def test_a_single_model_run_reuses_the_all_results_and_a_stray_model_does_not() -> None:
    single = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await single.start()
    for rec in records(800, 1000.0, 1.5, 3):
        single.record(dataclasses.replace(rec, model="only"))
    await single.flush()
    result = await compute_stats(single, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    assert set(result["results"]) == {"all", "only"}
    # identical rows: the per-model result is the "all" one, draws included (not a second
    # bootstrap with other random numbers), and a separate copy
    assert result["results"]["only"] == result["results"]["all"]
    assert result["results"]["only"] is not result["results"]["all"]

    # a 404 for another model is not usable: no summary holds it, so "only" still holds every
    # usable request and reuses "all"
    single.record(typo_404())
    await single.flush()
    again = await compute_stats(single, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    assert set(again["results"]) == {"all", "only"}
    assert again["results"]["only"] == again["results"]["all"]
    # one answered request for another model: "only" is computed on its own (its own draws)
    single.record(dataclasses.replace(typo_404(), request_id="ok", status=200, t_start=1050.0))
    await single.flush()
    third = await compute_stats(single, run_id=RUN, stats_cfg=CFG, window_end=1080.0)
    assert set(third["results"]) == {"all", "only", "no-such-model"}
    alone, pooled = third["results"]["only"]["all"], third["results"]["all"]["all"]
    assert alone["samples"]["speculative"] == pooled["samples"]["speculative"]
    assert alone["samples"]["baseline"] == pooled["samples"]["baseline"] - 1
    assert alone["metrics"]["e2e"]["speedup"] != pooled["metrics"]["e2e"]["speedup"]
    await single.close()


async def test_identical_data_gets_identical_intervals_in_every_window(store: MemoryStore) -> None:
    # The run spans 160 s: the 1h and whole-run windows hold the same requests. Each window draws
    # from its own key (segment and units), not from a stream the earlier windows consumed.
    cfg = dataclasses.replace(CFG, windows_s=(60.0, 3600.0, None))
    result = await compute_stats(store, run_id=RUN, stats_cfg=cfg, warmup=WARMUP, window_end=1160.0)
    hour, whole = result["results"]["all"]["1h"], result["results"]["all"]["all"]
    assert hour["span"] == whole["span"] and hour["samples"] == whole["samples"]
    assert hour["metrics"] == whole["metrics"]
    minute = result["results"]["all"]["1m"]
    assert minute["span"] != whole["span"]
    assert minute["metrics"]["e2e"]["speedup"] != whole["metrics"]["e2e"]["speedup"]


async def test_a_small_run_is_read_as_rows_and_a_large_one_as_summaries(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, window_end=1160.0)
    monkeypatch.setattr(tick, "ROWS_MAX", 0)
    sums = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, window_end=1160.0)
    by_rows, by_sums = rows["results"]["all"]["all"], sums["results"]["all"]["all"]
    # rows: units of a second for a 160 s run (span / 200, at least 1 s); summaries: minutes
    assert by_rows.get("source") == "rows" and by_rows.get("unit_s") == 1.0
    assert by_sums.get("source") == "summaries" and by_sums.get("unit_s") == 60.0
    # warm-up leaves out whole units: with 5 requests per arm a second, exactly the first
    # second on rows, the whole first minute on summaries (and 4 seconds / a minute after the
    # restart at 1040 for the speculative arm's 20)
    assert by_rows["excluded_warmup"] == {"baseline": 5, "speculative": 25}
    assert by_sums["excluded_warmup"]["baseline"] == 100  # minute 16 (960-1020) holds t 1000-1019.8
    # the same estimators on the same requests: point estimates agree within the grid bound
    # where both kept the same requests (the speculative arm: minute 17 holds the restart)
    for metric in ("e2e", "ttft", "tpot"):
        for side in ("baseline",):
            for stat in ("median", "p90"):
                a = by_rows["metrics"][metric]["summary"][side][stat]
                b = by_sums["metrics"][metric]["summary"][side][stat]
                assert a is not None and b is not None and math.isclose(a, b, rel_tol=0.2)


async def test_configs_of_a_stored_result_reproduce_its_settings() -> None:
    live = StatsConfig(p99_tolerance=0.0, alpha=0.01, resamples=500, windows_s=(600.0, None))
    warm = WarmupConfig(requests=7, restart_requests=3, restart_seconds=1.5)
    stored = json.loads(json.dumps(result_settings(live, warm)))
    stats, warmup = configs_of({"settings": stored}, StatsConfig(), WarmupConfig())
    assert stats == dataclasses.replace(live, interval_s=StatsConfig().interval_s)
    assert warmup == warm
    # an older result without some keys keeps the given values for them
    old = {"settings": {"resamples": 300}}
    assert configs_of(old, StatsConfig(), warm) == (StatsConfig(resamples=300), warm)


def test_row_units_divide_a_minute() -> None:
    from specproxy.stats.job.rows import row_unit

    got = [row_unit(s) for s in (10.0, 90.0, 1000.0, 2400.0, 7000.0, 12_000.0, 1e6)]
    assert got == [1.0, 1.0, 5.0, 12.0, 30.0, 60.0, 60.0]
    assert all(60.0 % u == 0 for u in got)


def _close(a: object, b: object, path: str, rel: float) -> None:
    """Two results agree: the same keys, strings, booleans and integers; floats within `rel`."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), path
        for key in a:
            _close(a[key], b[key], f"{path}.{key}", rel)
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _close(x, y, f"{path}[{i}]", rel)
    elif isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=rel, abs_tol=1e-12), (path, a, b)
    else:
        assert a == b, (path, a, b)


def with_conditions(rec: RequestRecord, i: int) -> RequestRecord:
    """The request's conditions: loads 1-6, every third at temperature 0, half "code"."""
    return dataclasses.replace(
        rec,
        endpoint_in_flight=1 + (i // 2) % 6,
        temperature=0.0 if i % 3 == 0 else None,
        category="code" if i % 4 < 2 else "chat",
    )


async def test_rows_and_summaries_agree_on_every_statistic_within_the_grid_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The same requests as rows (the small-run source) and as the store's summaries, at the
    same time unit: one pipeline, so every statistic, verdict and diagnosis agrees within the
    grid bound (bins are identical; only float sums are added in another order), the speedups
    by condition too (the summaries' condition keys)."""
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for i, rec in enumerate(minute_records(minutes=40, per_minute=60, seed=4)):
        s.record(with_conditions(rec, i))
    s.record_engine(EngineSample(T0 + 600, RUN, "speculative", True, acceptance_rate=0.6))
    s.record_engine(EngineSample(T0 + 610, RUN, "speculative", True, restarted=True))
    await s.flush()
    cfg = StatsConfig(windows_s=(600.0, None), resamples=300)
    warmup = WarmupConfig(requests=30, restart_requests=10, restart_seconds=5.0)
    end = T0 + 40 * 60
    monkeypatch.setattr(tick, "row_unit", lambda span: 60.0)
    rows = await compute_stats(s, run_id=RUN, stats_cfg=cfg, warmup=warmup, window_end=end)
    monkeypatch.setattr(tick, "ROWS_MAX", 0)
    sums = await compute_stats(s, run_id=RUN, stats_cfg=cfg, warmup=warmup, window_end=end)
    await s.close()
    # the crossover: each request at its own load and latency from rows, the load keys' coarse
    # bins from the summaries (their intervals widened by the grid's bound): compared apart
    crossovers = []
    spans = []  # the whole run from rows, the last hour from summaries: here the same 40 min
    for result in (rows, sums):
        for key in ("computed_at", "duration_s", "lag_s", "data_horizon"):
            result.pop(key)  # type: ignore[misc]
        for windows in result["results"].values():
            for window in windows.values():
                window.pop("source")
                for block in (window, *window.get("comparisons", {}).values()):
                    conditions = block.get("conditions")
                    if conditions is not None and "crossover" in conditions:  # one dict, shared
                        crossovers.append(conditions.pop("crossover"))  # type: ignore[misc]
                        spans.append(conditions.pop("window_s"))
    # the whole-run window of all models (and of its one model, the same), from each source
    assert len(crossovers) == 4
    assert spans == [None, None, 3600.0, 3600.0]
    for metric in ("e2e", "tpot"):
        from_rows, from_sums = crossovers[0][metric], crossovers[2][metric]
        assert from_rows["status"] == from_sums["status"] == "helps_throughout"
        assert from_rows["observed"] == from_sums["observed"] == [1.0, 6.0]
        assert len(from_rows["groups"]) == len(from_sums["groups"]) == 6
        for r, w in zip(from_rows["groups"], from_sums["groups"], strict=True):
            assert r["load"] == w["load"] and r["n"] == w["n"]
            assert w["speedup"] == pytest.approx(r["speedup"], rel=COARSE_ERROR_BOUND)
    whole = rows["results"]["all"]["all"]
    bands = whole["conditions"]["segments"]  # type: ignore[index]
    assert [b["band"] for b in bands["load"]["tpot"]] == ["1", "2-3", "4-7"]
    assert {b["band"] for b in bands["category"]["tpot"]} == {"chat", "code"}
    assert all(b["status"] == "ok" for dim in bands.values() for b in dim["tpot"])
    assert whole["excluded_warmup"]["speculative"] > whole["excluded_warmup"]["baseline"] > 0
    assert {r["code"] for r in whole["diagnosis"]["reasons"]} >= {"warmup"}
    assert whole["metrics"]["e2e"]["adjusted"] is not None
    _close(rows, sums, "result", GRID_ERROR_BOUND)


async def test_a_tick_reads_engine_aggregates_with_the_results_of_every_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """compute_stats reads the store's engine aggregates and restart samples, not every sample:
    its result equals the computation fed every stored sample (restarts, warm-up and engine
    summaries included), from rows and from summaries."""
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for rec in minute_records(minutes=40, per_minute=60):
        s.record(rec)
    shift = T0 - 1000.0 + 30.0
    samples = [
        dataclasses.replace(x, t=x.t + shift, run_id=RUN)
        for x in random_engine_samples(3, n=600, replicas=2)  # 1000 s, both arms
    ]
    for x in samples:
        s.record_engine(x)
    await s.flush()
    assert any(x.restarted and x.up for x in samples)
    cfg = StatsConfig(windows_s=(300.0, 1800.0, None), resamples=100)
    warmup = WarmupConfig(requests=5, restart_requests=3, restart_seconds=20.0)
    end = T0 + 40 * 60
    stored = SampleView(await s.read_engine_samples(run_id=RUN))
    planned: list[tick.TickPlan] = []
    real = tick.plan_tick

    def spy(*args: Any, **kwargs: Any) -> tick.TickPlan:
        planned.insert(0, real(*args, **kwargs))
        return planned[0]

    monkeypatch.setattr(tick, "plan_tick", spy)
    for rows_max in (tick.ROWS_MAX, 0):
        monkeypatch.setattr(tick, "ROWS_MAX", rows_max)
        got = await compute_stats(s, run_id=RUN, stats_cfg=cfg, warmup=warmup, window_end=end)
        want = tick.compute_tick(planned[0], stored, run_id=RUN, stats_cfg=cfg, warmup=warmup)
        assert got["results"] == want["results"]
        whole = got["results"]["all"]["all"]
        assert whole["engine"]["speculative"]["restarts"] > 0
        assert sum(whole["excluded_warmup"].values()) > 10
    await s.close()


async def test_rows_and_summaries_give_the_same_per_model_results(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Per model from both sources: the same models and verdicts (speculation helps "a" and hurts
    "b"); a model the labeller no longer keeps is compared under "other"."""
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for i, rec in enumerate(minute_records(40, 60, seed=3)):
        if i % 6 in (0, 1):  # a third of each arm's requests: model "b", 1.25x slower
            slow = 1.25 if rec.arm == "speculative" else 1 / 1.5
            tpot = (rec.tpot_s or 0.0) * (1.5 if rec.arm == "speculative" else 1.0) * slow
            e2e = 0.1 + 100 * tpot
            rec = dataclasses.replace(rec, model="b", tpot_s=tpot, e2e_s=e2e, upstream_s=e2e)
        else:
            rec = dataclasses.replace(rec, model="a")
        s.record(rec)
    await s.flush()
    cfg = StatsConfig(windows_s=(600.0, None), resamples=200)
    none = WarmupConfig(requests=0, restart_requests=0, restart_seconds=0.0)
    end = T0 + 40 * 60
    rows = await compute_stats(s, run_id=RUN, stats_cfg=cfg, warmup=none, window_end=end)
    monkeypatch.setattr(tick, "ROWS_MAX", 0)
    sums = await compute_stats(s, run_id=RUN, stats_cfg=cfg, warmup=none, window_end=end)
    assert set(sums["results"]) == set(rows["results"]) == {"all", "a", "b"}
    for model, verdict in (("a", "faster"), ("b", "slower")):
        for result in (rows, sums):
            window = result["results"][model]["all"]
            assert window["metrics"]["tpot"]["verdict"] == verdict, (model, window.get("source"))
        r, w = rows["results"][model]["all"], sums["results"][model]["all"]
        assert r["samples"] == w["samples"]
        r_adj, w_adj = r["metrics"]["e2e"]["adjusted"], w["metrics"]["e2e"]["adjusted"]
        assert r_adj is not None and w_adj is not None
        assert w_adj["estimate"] == pytest.approx(r_adj["estimate"], rel=1e-9)
    relabelled = await compute_stats(
        s,
        run_id=RUN,
        stats_cfg=cfg,
        warmup=none,
        window_end=end,
        model_label=lambda m: m if m == "a" else "other",
    )
    assert set(relabelled["results"]) == {"all", "a", "other"}
    assert (
        relabelled["results"]["other"]["all"]["samples"] == sums["results"]["b"]["all"]["samples"]
    )
    await s.close()


async def test_the_draft_step_branch_fires_from_rows_and_from_summaries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A speculative step 60 % longer than a target step (median gap between streamed events)
    and no speedup: the diagnosis says so whichever source the window came from (the summaries
    carry the gaps as the "step" metric)."""
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for rec in minute_records(minutes=20, per_minute=40, seed=6):
        slow = rec.arm == "speculative"
        tpot = (rec.tpot_s or 0.0) * (1.5 if slow else 1.0)  # no speedup left
        e2e = 0.1 + 100 * tpot
        gap = 0.02 * (1.6 if slow else 1.0)
        s.record(dataclasses.replace(rec, tpot_s=tpot, e2e_s=e2e, upstream_s=e2e, mean_gap_s=gap))
    await s.flush()
    cfg = StatsConfig(windows_s=(None,), resamples=100)
    for rows_max in (tick.ROWS_MAX, 0):
        monkeypatch.setattr(tick, "ROWS_MAX", rows_max)
        result = await compute_stats(s, run_id=RUN, stats_cfg=cfg, window_end=T0 + 20 * 60)
        diagnosis = result["results"]["all"]["all"]["diagnosis"]
        assert diagnosis.get("draft_step_share") == pytest.approx(0.6, rel=1e-3)
        assert "draft_step_share" in {r["code"] for r in diagnosis["reasons"]}
    await s.close()


async def test_the_whole_run_window_carries_speedups_by_condition() -> None:
    """Requests that state their load, temperature and category: the whole-run window of all
    models has their bands and crossover; shorter windows and per-model results have none."""
    store = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await store.start()
    for i, rec in enumerate(records(1600, 1000.0, 1.5, 5)):
        store.record(
            dataclasses.replace(
                rec,
                endpoint_in_flight=1 + (i // 2) % 8,
                temperature=0.0 if i % 3 == 0 else None,
                category="code" if i % 4 < 2 else "chat",
            )
        )
    await store.flush()
    result = await compute_stats(store, run_id=RUN, stats_cfg=CFG, window_end=1160.0)
    whole = result["results"]["all"]["all"].get("conditions")
    assert whole is not None and whole["load"] == "endpoint_in_flight"
    loads = whole["segments"]["load"]["tpot"]
    assert [b["band"] for b in loads] == ["1", "2-3", "4-7", "8-15"]
    # every usable request of the window (warm-up left out) is in one load band
    samples = result["results"]["all"]["all"]["samples"]
    assert sum(b["n"]["control"] for b in loads) == samples["baseline"]
    assert sum(b["n"]["treatment"] for b in loads) == samples["speculative"]
    for band in loads:  # the speculative arm is 1.5x faster per token at every load
        assert band["status"] == "ok"
        assert band["lower"] is not None and band["upper"] is not None
        assert 1.2 < band["lower"] < 1.5 < band["upper"] < 1.9
    temps = {b["band"] for b in whole["segments"]["temperature"]["tpot"]}
    assert temps == {"0", "default"}
    assert {b["band"] for b in whole["segments"]["category"]["e2e"]} == {"chat", "code"}
    assert whole["crossover"]["tpot"]["status"] == "helps_throughout"
    assert whole["summary"] is not None and whole["summary"].startswith("speculation helps")
    reasons = result["results"]["all"]["all"]["diagnosis"]["reasons"]
    assert {"code": "crossover", "message": whole["summary"], "detail": None} in reasons
    assert result["results"]["all"]["1m"].get("conditions") is None
    assert result["results"]["m-a"]["all"].get("conditions") is None
    json.dumps(result, allow_nan=False)


@pytest.mark.parametrize("source", ["rows", "summaries"])
async def test_future_rows_change_no_window_and_are_counted(
    store: MemoryStore, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """A replica 3 h fast (or a clock stepped back) adds 400 rows stamped 3 h after now: every
    window, on rows and on summaries, is what it was without them; the result counts them."""
    if source == "summaries":
        monkeypatch.setattr(tick, "ROWS_MAX", 0)
    now = 1160.0  # the run's rows: 1000-1159.9
    clean = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, now=now)
    for rec in records(400, now + 3 * 3600.0, 1.5, 7):
        store.record(dataclasses.replace(rec, request_id=f"fast-{rec.request_id}"))
    await store.flush()
    skewed = await compute_stats(store, run_id=RUN, stats_cfg=CFG, warmup=WARMUP, now=now)
    assert skewed["results"] == clean["results"]
    assert skewed["window_end"] == clean["window_end"] <= now + CFG.future_skew_s
    assert skewed["data_horizon"] == clean["data_horizon"]
    assert (clean["future_rows"], clean["future_newest"]) == (0, None)
    assert skewed["future_rows"] == 400
    newest = skewed["future_newest"]
    # rows: the newest stamp; summaries: the end of its minute
    want = now + 3 * 3600.0 + 39.9 if source == "rows" else 12_000.0
    assert newest is not None and newest == pytest.approx(want)
    lag = skewed["lag_s"]
    assert lag is not None and lag >= 0
    first = skewed["results"]["all"]["1m"]
    assert first["span"][1] <= now + CFG.future_skew_s + first["unit_s"]


async def test_rows_within_the_skew_allowance_count_and_the_lag_stays_at_zero() -> None:
    """Stamps up to future_skew_s after now are data (clocks a little apart): in the windows,
    the horizon at the newest of them, and the lag 0 rather than negative. The result's
    computed_at is the wall clock, so the stamps are set from it (1000 s ahead, an allowance
    of an hour: the computation would have to take 16 minutes to see them in the past)."""
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    now = time.time()
    for rec in records(200, now + 1000.0, 1.5, 3):
        s.record(rec)
    await s.flush()
    cfg = dataclasses.replace(CFG, future_skew_s=3600.0)
    result = await compute_stats(s, run_id=RUN, stats_cfg=cfg, warmup=WARMUP, now=now)
    await s.close()
    assert result["future_rows"] == 0
    assert result["data_horizon"] == pytest.approx(now + 1019.9, abs=1e-3)
    whole = result["results"]["all"]["all"]
    assert {arm: n + whole["excluded_warmup"][arm] for arm, n in whole["samples"].items()} == {
        "baseline": 100,
        "speculative": 100,
    }
    assert result["lag_s"] == 0.0
