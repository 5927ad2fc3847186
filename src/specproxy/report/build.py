"""The report behind `specproxy report`: one self-contained HTML file plus its PNGs, from a store.

The headline numbers (speedups, CIs, verdicts, diagnosis) are the stats job's last result for
the run, read from the store's stats history, so the report says exactly what GET /api/stats said
at the end; a store without history (e.g. a bench run) gets one stats computation first. The
figures are drawn from the stored records with the stats job's own selection (successful primary
requests, warm-up excluded), so their n per arm match the result's. Everything the HTML shows is
also written to `report.json` for machines and tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
import numpy.typing as npt

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.records import Arm, EngineSample
from specproxy.report import figures
from specproxy.report.analysis import (
    in_flight_at_start,
    load_at,
    mean_position_acceptance,
    speedup_by_load,
)
from specproxy.report.data import FloatArray, ReportData
from specproxy.report.html import render_html
from specproxy.report.summary import arm_figures, arms_of, main_window, shown_arms
from specproxy.stats.job.rows import ROW_READ, usable_mask
from specproxy.stats.job.tick import configs_of, warmup_rule
from specproxy.stats.result import METRIC_COLUMNS, StatsResult, run_arms
from specproxy.stats.warmup import WarmupRule, excluded_units, restart_times
from specproxy.store.contract import Export, History, StatsStore, SummaryReader
from specproxy.store.factory import open_store
from specproxy.summary.rows import records_to_arrays

__all__ = [
    "COLUMNS",
    "ReportStore",
    "collect",
    "report_from_store",
    "report_json",
    "speedup_series",
    "write_report",
]

# The report reads exactly what the stats job reads, so its selection can match the job's.
COLUMNS = ROW_READ


class ReportStore(Export, History, SummaryReader, Protocol):
    """What a report reads: records and engine samples, the stats history, and what the stats
    job reads when a run has no history to report."""


async def write_report(
    store_url: str,
    *,
    run_id: str | None,
    out_dir: Path,
    settings: StatsConfig | None = None,
    stats_at: float | None = None,
    warmup: WarmupConfig | None = None,
    control: str | None = None,
) -> Path | None:
    """Open the store at `store_url`, then `report_from_store`; None when nothing was recorded."""
    store = open_store(StoreConfig(url=store_url))
    await store.start(read_only=True)  # a report never writes, replays spill files or migrates
    try:
        return await report_from_store(
            store,
            run_id=run_id,
            out_dir=out_dir,
            settings=settings,
            stats_at=stats_at,
            warmup=warmup,
            control=control,
        )
    finally:
        await store.close()


async def report_from_store(
    store: ReportStore,
    *,
    run_id: str | None,
    out_dir: Path,
    settings: StatsConfig | None = None,
    stats_at: float | None = None,
    warmup: WarmupConfig | None = None,
    control: str | None = None,
) -> Path | None:
    """Read the run from an open store, draw, write index.html, the PNGs and report.json.

    `stats_at` names the stats result to report (its `computed_at`), e.g. the final result a
    live proxy served; by default the run's last one. The caller keeps the store open (a live
    proxy's `memory://` store holds the only copy of the run). `control`: the control arm of a
    run the report computes afresh without a stored result to take the arms from (a bench or
    ingest run with named arms).
    """
    data = await collect(
        store,
        run_id=run_id,
        settings=settings or StatsConfig(),
        stats_at=stats_at,
        warmup=warmup,
        control=control,
    )
    if data is None:
        return None
    await asyncio.to_thread(_draw_and_write, data, out_dir)
    return out_dir


async def collect(
    store: ReportStore,
    *,
    run_id: str | None,
    settings: StatsConfig,
    stats_at: float | None = None,
    warmup: WarmupConfig | None = None,
    control: str | None = None,
) -> ReportData | None:
    """The run's records (with the stats job's selection), engine samples and stats history;
    the settings and arms of the run's last stored result win over `settings`, `warmup` and
    `control`."""
    run_id = run_id or await _latest_run(store)
    if run_id is None:
        return None
    records = await store.read_records(run_id=run_id, columns=COLUMNS)
    if not any(records.values()):
        return None
    arrays = await asyncio.to_thread(records_to_arrays, COLUMNS, records)
    engine = await store.read_engine_samples(run_id=run_id)
    history = [  # stored by the stats job: `StatsResult`s as JSON
        (t, cast(StatsResult, r)) for t, r in await store.read_stats_history(run_id=run_id)
    ]
    if stats_at is not None:
        chosen = [i for i, (_, r) in enumerate(history) if r["computed_at"] == stats_at]
        if chosen:
            history = history[: chosen[-1] + 1]
    last = history[-1][1] if history else None
    warmup = warmup or WarmupConfig()
    if last is not None:
        settings, warmup = configs_of(last, settings, warmup)
    until = last["window_end"] if last is not None else None
    data = _gather(run_id, arrays, engine, settings, warmup, _unit_s(last), until=until)
    if last is None or not _consistent(last, data):
        # No history (a bench run), or records the last stats run did not see: compute afresh.
        history.append(await _compute_stats(store, run_id, settings, warmup, last, control))
        unit_s = _unit_s(history[-1][1])
        data = _gather(run_id, arrays, engine, settings, warmup, unit_s, until=None)
        data.recomputed = True
    data.history = history
    data.stats_t, data.stats = history[-1]
    return data


def _unit_s(result: StatsResult | None) -> float:
    """The time unit of the result's main window (warm-up leaves out whole units of it)."""
    window = main_window(result)
    return float(window.get("unit_s", 60.0)) if window is not None else 60.0


def _gather(
    run_id: str,
    arrays: Mapping[Arm, Mapping[str, npt.NDArray[Any]]],
    engine: list[EngineSample],
    settings: StatsConfig,
    warmup: WarmupConfig,
    unit_s: float,
    *,
    until: float | None,
) -> ReportData:
    data = ReportData(
        run_id=run_id,
        stats=None,
        stats_t=None,
        history=[],
        latency={metric: {} for metric in METRIC_COLUMNS},
        t_start={},
        e2e_aligned={},
        excluded_warmup={},
        excluded_failed={},
        shadows={},
        engine=engine,
        settings=settings,
        warmup=warmup,
        span=None,
    )
    starts: list[float] = []
    for arm in sorted(arrays):
        a = arrays.get(arm)
        if a is None or len(a["t_start"]) == 0:
            continue
        rule = warmup_rule(warmup)
        keep, warm, failed = _selection(a, arm, engine, rule, unit_s, until=until)
        data.excluded_warmup[arm] = warm
        data.excluded_failed[arm] = failed
        data.shadows[arm] = int(np.sum(np.asarray(a["shadow"], dtype=bool)))
        data.t_start[arm] = np.asarray(a["t_start"], dtype=np.float64)[keep]
        data.e2e_aligned[arm] = np.asarray(a["e2e_s"], dtype=np.float64)[keep]
        for metric, column in METRIC_COLUMNS.items():
            values = np.asarray(a[column], dtype=np.float64)[keep]
            data.latency[metric][arm] = values[np.isfinite(values) & (values > 0)]
        starts += [float(a["t_start"][0]), float(a["t_start"][-1])]
    data.span = (min(starts), max(starts)) if starts else None
    return data


def _consistent(result: StatsResult, data: ReportData) -> bool:
    """Does the stats result describe exactly the records the figures are drawn from?"""
    window = main_window(result)
    if window is None:
        return False
    if window["design"] != "split":
        return True  # paired n counts pairs, not records: nothing to compare
    n = {arm: arm_figures(window, arm)["n"] for arm in shown_arms(window)}  # every arm's
    arms = {*n, *data.latency["e2e"]}
    return all(n.get(arm, 0) == data.latency["e2e"].get(arm, np.array([])).size for arm in arms)


def _selection(
    a: Mapping[str, npt.NDArray[Any]],
    arm: Arm,
    engine: Sequence[EngineSample],
    rule: WarmupRule,
    unit_s: float,
    *,
    until: float | None,
) -> tuple[npt.NDArray[np.bool_], int, int]:
    """The stats job's sample: usable primary requests outside the warm-up units, by the very
    rule the job applies (`stats.warmup`) at the result's unit; also the warm-up and failed
    counts."""
    t = np.asarray(a["t_start"], dtype=np.float64)
    usable = usable_mask(a)
    primary = ~np.asarray(a["shadow"], dtype=bool)
    unit = np.floor(t / unit_s).astype(np.int64)
    counted, n = np.unique(unit[usable & primary], return_counts=True)
    gone = excluded_units(counted, n, restart_times(engine, arm), unit_s=unit_s, rule=rule)
    warm = usable & primary & np.isin(unit, sorted(gone))
    in_time = t <= until if until is not None else np.ones(t.size, dtype=bool)
    keep = usable & ~warm & primary & in_time
    return keep, int(np.sum(warm & in_time)), int(np.sum(~usable & in_time))


async def _latest_run(store: Export) -> str | None:
    best: tuple[float, str] | None = None
    for run_id in await store.run_ids():
        records = await store.read_records(run_id=run_id, columns=["t_start"])
        last = max((float(rows[-1][0]) for rows in records.values() if rows), default=None)
        if last is not None and (best is None or last > best[0]):
            best = (last, run_id)
    return best[1] if best else None


async def _compute_stats(
    store: StatsStore,
    run_id: str,
    settings: StatsConfig,
    warmup: WarmupConfig,
    last: StatsResult | None = None,
    control: str | None = None,
) -> tuple[float, StatsResult]:
    """A store without stats history (a bench run), or records the last result did not see:
    compute the comparison once, with the last result's arms (A/B/n: its control and
    treatments) where there is one, else `control` against every other arm of the run, else
    the two-arm shorthand."""
    from specproxy.stats.job.tick import compute_stats

    held = run_arms(last)
    arms: dict[str, Any] = {}
    if held is not None and last is not None:
        arms = {"control": held[0], "treatments": held[1], "labels": last.get("arm_labels", {})}
    elif control is not None:
        arms = {"control": control}
    result = await compute_stats(store, run_id=run_id, stats_cfg=settings, warmup=warmup, **arms)
    return float(result["computed_at"]), result


def _draw_and_write(data: ReportData, out_dir: Path) -> None:
    """Draw every figure, then write the PNGs, report.json and index.html (worker thread)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    _draw(data)
    for name, png in data.figures.items():
        (out_dir / f"{name}.png").write_bytes(png)
    (out_dir / "report.json").write_text(json.dumps(report_json(data), indent=2))
    (out_dir / "index.html").write_text(render_html(data), encoding="utf-8")


def _draw(data: ReportData) -> None:
    data.figures["cdf_e2e"] = figures.latency_cdf_png(
        data.latency["e2e"], title="End-to-end latency per arm", xlabel="E2E"
    )
    data.figures["cdf_tpot"] = figures.latency_cdf_png(
        data.latency["tpot"], title="Time per output token per arm", xlabel="TPOT"
    )
    data.figures["cdf_ttft"] = figures.latency_cdf_png(
        data.latency["ttft"], title="Time to first token per arm", xlabel="TTFT"
    )
    for stat, label in (("median", "median"), ("p99", "P99")):
        t, est, lo, hi = speedup_series(data.history, "e2e", stat)
        data.figures[f"speedup_time_{stat}"] = figures.speedup_over_time_png(
            t, est, lo, hi, title=f"E2E {label} speedup over time (band: CI)"
        )
    window = main_window(data.stats)
    # the acceptance and load figures: the control against the first treatment (A/B/n: every
    # treatment's speedups by condition are in the HTML's "By condition" section)
    control, treatments = arms_of(window) if window is not None else ("baseline", ["speculative"])
    treatment = treatments[0]
    data.positions = mean_position_acceptance(data.engine, arm=treatment)
    rate = arm_figures(window, treatment)["acceptance_rate"] if window is not None else None
    data.figures["acceptance"] = figures.acceptance_png(
        data.positions,
        overall=rate,
        title=f"Draft acceptance per position ({treatment} arm)",
    )
    _load_figure(data, control, treatment)


def _load_figure(data: ReportData, control: str, treatment: str) -> None:
    spec_t = data.t_start.get(treatment, np.array([]))
    base_t = data.t_start.get(control, np.array([]))
    spec_e2e_all = _aligned_e2e(data, treatment)
    base_e2e_all = _aligned_e2e(data, control)
    has_running = any(s.requests_running is not None for s in data.engine)
    if has_running:
        spec_load, base_load = load_at(spec_t, data.engine), load_at(base_t, data.engine)
        data.load_source = "vLLM requests running (mean over arms, last scrape before arrival)"
    else:
        all_t = np.concatenate([spec_t, base_t])
        all_e = np.concatenate([spec_e2e_all, base_e2e_all])
        inflight = in_flight_at_start(all_t, all_e)
        spec_load, base_load = inflight[: spec_t.size], inflight[spec_t.size :]
        data.load_source = "requests in flight through the proxy at arrival (both arms)"
    bins = speedup_by_load(
        spec_load,
        spec_e2e_all,
        base_load,
        base_e2e_all,
        rng=np.random.default_rng(data.settings.seed),
        confidence=data.settings.confidence,
    )
    data.load_bins = [
        {
            "load": b.load,
            "estimate": b.estimate,
            "lower": b.lower,
            "upper": b.upper,
            "n_speculative": b.n_speculative,
            "n_baseline": b.n_baseline,
        }
        for b in bins
    ]
    data.figures["speedup_load"] = figures.speedup_vs_load_png(
        [b.load for b in bins],
        [b.estimate for b in bins],
        [b.lower for b in bins],
        [b.upper for b in bins],
        [b.n_speculative + b.n_baseline for b in bins],
        xlabel=f"load: {data.load_source}",
        title="Median E2E speedup against load"
        + ("" if (control, treatment) == ("baseline", "speculative") else f" ({treatment})"),
    )


def _aligned_e2e(data: ReportData, arm: str) -> FloatArray:
    return data.e2e_aligned.get(arm, np.array([], dtype=np.float64))


def speedup_series(
    history: Sequence[tuple[float, StatsResult]], metric: str, statistic: str
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(t, estimate, lower, upper) of one speedup over the stats history (whole-run window)."""
    t: list[float] = []
    est: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    for when, result in history:
        window = main_window(result)
        if window is None:
            continue
        s = window["metrics"][metric]["speedup"].get(statistic)
        if s is None or s["status"] != "ok":
            continue
        estimate, lower, upper = s["estimate"], s["lower"], s["upper"]
        if estimate is None or lower is None or upper is None:
            continue
        t.append(when)
        est.append(estimate)
        lo.append(lower)
        hi.append(upper)
    return t, est, lo, hi


def report_json(data: ReportData) -> dict[str, Any]:
    """The numbers the report shows, for machines (and the tests that compare them)."""
    quantiles: dict[str, Any] = {}
    for metric, per_arm in data.latency.items():
        quantiles[metric] = {
            arm: {
                "n": int(v.size),
                "median": float(np.median(v)) if v.size else None,
                "p99": float(np.quantile(v, 0.99)) if v.size else None,
            }
            for arm, v in per_arm.items()
        }
    return {
        "run_id": data.run_id,
        "stats_t": data.stats_t,
        "stats": data.stats,
        "figures": sorted(f"{name}.png" for name in data.figures),
        "figure_data": {
            "latency": quantiles,
            "excluded_warmup": data.excluded_warmup,
            "excluded_failed": data.excluded_failed,
            "load_source": data.load_source,
            "load_bins": data.load_bins,
            "position_acceptance": list(data.positions),
            "speedup_over_time": {
                stat: dict(
                    zip(
                        ("t", "estimate", "lower", "upper"),
                        speedup_series(data.history, "e2e", stat),
                        strict=True,
                    )
                )
                for stat in ("median", "p99")
            },
        },
    }
