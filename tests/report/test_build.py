"""The report: files, self-containment, and every figure's numbers checked against the store."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
import uuid
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.errors import ErrorKind
from specproxy.records import EngineSample, RequestRecord
from specproxy.report.build import collect, write_report
from specproxy.report.summary import fmt_ratio, main_window
from specproxy.scrape.dcgm import combine_readings, parse_dcgm
from specproxy.stats.job.tick import compute_stats
from specproxy.stats.result import StatsResult
from specproxy.store.factory import open_store
from specproxy.summary.grid import GRID_ERROR_BOUND
from tests.store.helpers import read_arrays

RUN = "r1"
DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"
T0 = 1_700_000_000.0
WARMUP = 20
WARM = WarmupConfig(requests=WARMUP)


def _records(rng: np.random.Generator, n: int = 400) -> list[RequestRecord]:
    rows = []
    for i in range(n):
        arm = "speculative" if i % 2 else "baseline"
        scale = 0.1 if arm == "speculative" else 0.2
        e2e = float(rng.lognormal(np.log(scale), 0.3))
        if i < 2 * WARMUP:
            e2e *= 5  # cold start: must not show in any figure
        ttft = e2e * 0.1
        failed = i % 97 == 0
        rows.append(
            RequestRecord(
                request_id=uuid.uuid4().hex,
                run_id=RUN,
                arm=arm,
                t_start=T0 + i * 0.1,
                model="tiny-llama",
                endpoint="chat.completions",
                stream=True,
                status=500 if failed else 200,
                e2e_s=e2e,
                upstream_s=e2e,
                ttft_s=ttft,
                tpot_s=(e2e - ttft) / 63,
                prompt_tokens=20,
                output_tokens=64,
                error_kind=ErrorKind.HTTP_5XX if failed else None,
                endpoint_in_flight=1 + (i // 2) % 6,  # the load it met (its band's x)
            )
        )
    return rows


def _samples() -> list[EngineSample]:
    out = []
    for j in range(10):
        for arm in ("speculative", "baseline"):
            spec = arm == "speculative"
            out.append(
                EngineSample(
                    t=T0 + j * 4.0,
                    run_id=RUN,
                    arm=arm,
                    up=True,
                    acceptance_rate=0.6 if spec else None,
                    position_acceptance=(0.8, 0.6 + 0.01 * j, 0.4, 0.2) if spec else None,
                    requests_running=float(j % 4),
                )
            )
    return out


async def _fill(url: str, *, history: bool) -> list[tuple[float, StatsResult]]:
    store = open_store(StoreConfig(url=url))
    await store.start()
    try:
        records = _records(np.random.default_rng(7))
        written: list[tuple[float, StatsResult]] = []
        for cut in (200, 400) if history else (400,):
            for rec in records[cut - 200 if history else 0 : cut]:
                store.record(rec)
            for s in _samples():
                store.record_engine(s)
            await store.flush()
            if history:
                cfg = StatsConfig(resamples=500)
                result = await compute_stats(
                    store, run_id=RUN, stats_cfg=cfg, warmup=WARM, window_end=T0 + 100
                )
                stored = cast(dict[str, Any], result)
                await store.write_stats(run_id=RUN, t=result["computed_at"], result=stored)
                written.append((result["computed_at"], result))
        return written
    finally:
        await store.close()


async def _store_values(url: str, unit_s: float) -> dict[str, dict[str, np.ndarray]]:
    """Independently: usable requests per arm minus those in the time units holding the first
    WARMUP usable ones of each arm (a failed request fills no warm-up slot: record 0, a 500, is
    baseline's)."""
    store = open_store(StoreConfig(url=url))
    await store.start()
    try:
        arrays = await read_arrays(
            store, run_id=RUN, columns=["t_start", "status", "e2e_s", "tpot_s", "ttft_s"]
        )
    finally:
        await store.close()
    out: dict[str, dict[str, np.ndarray]] = {}
    for arm, a in arrays.items():
        usable = a["status"] == 200
        unit = np.floor(a["t_start"] / unit_s)
        before = np.cumsum(usable) - usable  # usable requests before each one
        warm_units = set(unit[usable & (before < WARMUP)].tolist())
        keep = usable & ~np.isin(unit, sorted(warm_units))
        out[arm] = {c: a[c][keep] for c in ("e2e_s", "tpot_s", "ttft_s")}
    return out


async def test_report_matches_store_and_stats(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    history = await _fill(url, history=True)
    out = tmp_path / "report"
    settings = StatsConfig(resamples=500)
    assert await write_report(url, run_id=None, out_dir=out, settings=settings, warmup=WARM) == out

    report = json.loads((out / "report.json").read_text())
    final = history[-1][1]
    assert report["run_id"] == RUN
    assert report["stats"] == json.loads(json.dumps(final))  # the last stats run, verbatim
    window = main_window(final)
    assert window is not None

    unit_s = window.get("unit_s")
    assert unit_s == 1.0  # a 40 s run: units of a second
    expected = await _store_values(url, unit_s)
    figure = report["figure_data"]
    for metric, column in (("e2e", "e2e_s"), ("tpot", "tpot_s"), ("ttft", "ttft_s")):
        for arm in ("speculative", "baseline"):
            shown = figure["latency"][metric][arm]
            values = expected[arm][column]
            assert shown["n"] == values.size == window["metrics"][metric]["n"][arm]
            assert shown["median"] == pytest.approx(float(np.median(values)))
            assert shown["p99"] == pytest.approx(float(np.quantile(values, 0.99)))
            summary = window["metrics"][metric]["summary"][arm]
            assert shown["median"] == pytest.approx(summary["median"], rel=GRID_ERROR_BOUND)
    # 5 requests per arm a second: the first 20 usable fill 4 seconds of the speculative arm and,
    # with the 500 at t = 0, 5 seconds of the baseline's (24 requests)
    assert figure["excluded_warmup"] == {"speculative": WARMUP, "baseline": WARMUP + 4}
    assert figure["excluded_warmup"] == window["excluded_warmup"]

    # Speedup over time: one point per stats run, straight from the history.
    series = figure["speedup_over_time"]["median"]
    assert series["t"] == [t for t, _ in history]
    for (_, result), est in zip(history, series["estimate"], strict=True):
        window = main_window(result)
        assert window is not None
        assert est == window["metrics"]["e2e"]["speedup"]["median"]["estimate"]

    # Acceptance per position: the mean over the stored scrapes.
    assert figure["position_acceptance"] == pytest.approx([0.8, 0.645, 0.4, 0.2])

    # Speedup by load: the stats result's load bands (TPOT), each at its requests' mean load,
    # and every band's requests add up to the requests used.
    bins = figure["load_bins"]
    conditions = window.get("conditions")
    assert conditions is not None
    every = conditions["segments"]["load"]["tpot"]
    assert [b["band"] for b in every] == ["1", "2-3", "4-7"]
    assert every[0]["status"] == "too_little_data"  # ~33 requests an arm, less warm-up: no point
    bands = every[1:]
    assert [b["band"] for b in bins] == ["2-3", "4-7"]
    for shown, band in zip(bins, bands, strict=True):
        assert (shown["estimate"], shown["lower"], shown["upper"], shown["load"]) == (
            band["speedup"],
            band["lower"],
            band["upper"],
            band["load"],
        )
    assert [b["load"] for b in bins] == pytest.approx([2.5, 5.0], rel=0.05)
    used = sum(b["n"]["treatment"] for b in every)
    assert used == window["metrics"]["tpot"]["n"]["speculative"]
    assert all(b["estimate"] > 1.5 for b in bins)  # the synthetic arm is 2x faster

    html = (out / "index.html").read_text()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert report["figures"] == pngs and len(pngs) == 7
    embedded = re.findall(r"src='data:image/png;base64,([A-Za-z0-9+/=]+)'", html)
    assert len(embedded) == len(pngs)
    assert all(base64.b64decode(b).startswith(b"\x89PNG") for b in embedded)
    assert "http://" not in html and "https://" not in html  # self-contained
    assert re.search(r"Requests from .* to .* \(\d+ s\)\.", html)  # a short run in seconds
    speedup = window["metrics"]["e2e"]["speedup"]["median"]["estimate"]
    assert fmt_ratio(speedup) in html
    # each verdict names the anytime-valid tests behind it (the synthetic arm is 2x faster)
    seq = window["metrics"]["e2e"]["sequential"]
    assert seq is not None and window["metrics"]["e2e"]["verdict"] == "faster"
    assert "median" in seq.get("decided_by", [])
    assert re.search(
        r"data-metric='e2e' data-treatment='speculative'>E2E<b>faster</b>"
        r"<small>by [^<]*median</small>",
        html,
    )
    # two arms read as they always did: no best line, no per-treatment headings
    assert "id='best'" not in html and "<h3" not in html
    for section in ("Verdicts", "Speedups", "Per arm", "Diagnosis", "Methodology"):
        assert f"<h2>{section}" in html
    assert "500 resamples" in html and f"first {WARMUP} successful requests per arm" in html


async def test_report_without_history_computes_stats(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'b.db'}"
    await _fill(url, history=False)
    out = tmp_path / "bench-report"
    settings = StatsConfig(resamples=300)
    assert await write_report(url, run_id=RUN, out_dir=out, settings=settings, warmup=WARM) == out
    report = json.loads((out / "report.json").read_text())
    window = main_window(report["stats"])
    assert window is not None and window["metrics"]["e2e"]["n"]["baseline"] > 100
    assert report["stats"]["settings"]["resamples"] == 300


async def test_report_of_a_stored_run_diagnoses_its_stored_gpu_samples(tmp_path: Path) -> None:
    # `specproxy report` runs in a process that never scraped a GPU: the thermal and bandwidth
    # branches come from the GPU samples in the store (the derived hot H200 exporter page).
    url = f"sqlite:///{tmp_path / 'g.db'}"
    await _fill(url, history=False)
    page = (DCGM / "derived_h200_hot_saturated.prom").read_text(encoding="utf-8")
    store = open_store(StoreConfig(url=url))
    await store.start()
    for t in (T0 + 10, T0 + 20, T0 + 30):
        store.record_gpu(combine_readings(t, "speculative", parse_dcgm(page), run_id=RUN))
    await store.close()
    out = tmp_path / "gpu-report"
    settings = StatsConfig(resamples=300)
    assert await write_report(url, run_id=RUN, out_dir=out, settings=settings, warmup=WARM) == out
    window = main_window(json.loads((out / "report.json").read_text())["stats"])
    assert window is not None
    codes = {r["code"] for r in window["diagnosis"]["reasons"]}
    assert {"memory_bandwidth_saturated", "thermal_throttling"} <= codes
    html = (out / "index.html").read_text()
    assert "thermal throttling: GPU clocks were cut" in html
    assert "memory bandwidth saturated" in html


async def test_empty_store_gives_no_report(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'e.db'}"
    assert await write_report(url, run_id=None, out_dir=tmp_path / "x") is None
    assert not (tmp_path / "x").exists()


async def test_report_selects_what_the_job_selected_across_a_restart() -> None:
    """The report applies the job's warm-up rule with the job's restart settings, not defaults."""
    store = open_store(StoreConfig(url="memory://"))
    await store.start()
    try:
        for rec in _records(np.random.default_rng(3)):
            store.record(rec)
        for i in range(5):  # 502s while the speculative arm is down: no warm-up slot
            store.record(
                dataclasses.replace(
                    _records(np.random.default_rng(i), n=2)[1],
                    t_start=T0 + 12.05 + 0.4 * i,
                    status=502,
                    error_kind=ErrorKind.CONNECT,
                )
            )
        spec = "speculative"
        for sample in (
            EngineSample(T0 + 10.0, RUN, spec, True, process_start_time=T0 - 100),
            EngineSample(T0 + 12.0, RUN, spec, False),
            EngineSample(T0 + 14.0, RUN, spec, False),
            # The new process start reads early (11.5 < 12.0): the window opens at 12.0.
            EngineSample(T0 + 15.0, RUN, spec, True, restarted=True, process_start_time=T0 + 11.5),
        ):
            store.record_engine(sample)
        await store.flush()
        warmup = WarmupConfig(requests=WARMUP, restart_requests=7, restart_seconds=0.0)
        result = await compute_stats(
            store,
            run_id=RUN,
            stats_cfg=StatsConfig(resamples=300),
            warmup=warmup,
            window_end=T0 + 100,
        )
        stored = cast(dict[str, Any], result)
        await store.write_stats(run_id=RUN, t=result["computed_at"], result=stored)
        data = await collect(store, run_id=RUN, settings=StatsConfig(resamples=100))
    finally:
        await store.close()
    assert data is not None and not data.recomputed  # the job's own result is reported
    window = main_window(result)
    assert window is not None
    # whole seconds: the baseline's first 20 usable fill 5 of them (24 requests, one 500), the
    # speculative arm's 4; after the restart (12.0) its next 7 usable fill seconds 12 and 13
    assert window["excluded_warmup"] == {"baseline": WARMUP + 4, "speculative": WARMUP + 10}
    assert data.excluded_warmup == window["excluded_warmup"]
    assert data.excluded_failed["speculative"] == 5 + sum(i % 97 == 0 for i in range(1, 400, 2))
    for metric in ("e2e", "ttft", "tpot"):
        for arm in ("speculative", "baseline"):
            assert data.latency[metric][arm].size == window["metrics"][metric]["n"][arm]
    # The first request after the restart window opened (12.0), not the last one before it, is
    # the first excluded: spec records sit at odd tenths, 11.9 stays, 12.1 .. 13.9 go.
    kept = data.t_start["speculative"] - T0
    assert np.any(np.isclose(kept, 11.9)) and not np.any((kept > 12.0) & (kept < 14.0))


async def test_a_stored_result_from_before_the_restart_settings_still_reports() -> None:
    """Results stored before `settings.restart_warmup_*` existed are read with the defaults."""
    store = open_store(StoreConfig(url="memory://"))
    await store.start()
    try:
        for rec in _records(np.random.default_rng(3)):
            store.record(rec)
        await store.flush()
        settings = StatsConfig(resamples=300)
        result = await compute_stats(
            store, run_id=RUN, stats_cfg=settings, warmup=WARM, window_end=T0 + 100
        )
        old = cast(dict[str, Any], json.loads(json.dumps(result)))
        del old["settings"]["restart_warmup_requests"], old["settings"]["restart_warmup_seconds"]
        await store.write_stats(run_id=RUN, t=result["computed_at"], result=old)
        data = await collect(store, run_id=RUN, settings=StatsConfig(resamples=100))
    finally:
        await store.close()
    assert data is not None and not data.recomputed  # the old row is the one reported
    assert data.stats is not None and "restart_warmup_requests" not in data.stats["settings"]
    assert data.warmup.requests == WARMUP  # the job's settings, read from the row
