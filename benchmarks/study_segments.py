"""Coverage of the conditional speedups (`stats.segments`) and of the crossover load
(`stats.estimate.crossover`) against known truths: the study behind issue 26's Done means.

1. Categories: three categories whose speedups (TPOT, in law) are 2.0, 1.4 and 1.1; lognormal
   TPOTs with a per-unit level the arms share (`tests.stats.test_segments.category_run`). Printed:
   the share of per-category 95 % intervals that hold their category's speedup, with its
   Monte-Carlo SE, as a small run gets them (its rows' condition summaries) and, with
   `--summaries-category-runs`, as a large one does: the same requests as records in a store,
   one unit a minute, read from the store's condition summaries by `compute_stats`.
2. Crossover: both arms through the emulator's engine on a virtual clock, three passes over 15
   closed-loop concurrency levels from 1 to 40 (`tests.stats.estimate.test_crossover.
   emulated_rows`); the truth is the model's own crossover (`emulator.model.
   crossover_concurrency`, 4,000 requests per level). Printed: the truth, the share of runs whose
   interval holds it, the estimates' mean and sd, the intervals' median width; from the
   requests (a run read as rows) and, with `--summaries-runs`, from the store's load keys (the
   run's virtual time stretched over 59 minutes, inside the hour the conditions' rollups are
   kept: coarse bins, quarter-doubling load keys, intervals widened by their bounds).

    .venv/bin/python -m benchmarks.study_segments [--category-runs 200] [--crossover-runs 30]
        [--summaries-category-runs 200] [--summaries-runs 30]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from tests.stats.estimate.test_crossover import (
    BASELINE,
    MAX_TOKENS,
    SPECULATIVE,
    emulated_rows,
    emulated_window,
)
from tests.stats.test_segments import CATEGORY_SPEEDUPS, category_coverage, category_run

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.emulator.model import crossover_concurrency
from specproxy.records import RequestRecord
from specproxy.stats.estimate.crossover import crossover
from specproxy.stats.job import tick
from specproxy.stats.result import Conditions
from specproxy.store.memory import MemoryStore
from specproxy.summary.tiering import CONDITION_MINUTES

T0 = 60_000.0  # a minute boundary
NO_WARMUP = WarmupConfig(requests=0, restart_requests=0, restart_seconds=0.0)


def _record(i: int, arm: str, t: float, tpot: float, **conditions: Any) -> RequestRecord:
    e2e = 0.05 + tpot * (MAX_TOKENS - 1)
    return RequestRecord(
        request_id=f"{arm}-{i}",
        run_id="study",
        arm=arm,
        t_start=t,
        model="m",
        endpoint="completions",
        stream=True,
        status=200,
        e2e_s=e2e,
        upstream_s=e2e,
        ttft_s=0.05,
        tpot_s=tpot,
        prompt_tokens=32,
        output_tokens=MAX_TOKENS,
        **conditions,
    )


def from_summaries(records: list[RequestRecord], end: float, resamples: int) -> Conditions:
    """The whole-run window's conditions of `records` as a large run gets them: written to a
    store (its condition rollups), read back from the summaries (`tick.ROWS_MAX` 0)."""

    async def run() -> Conditions:
        store = MemoryStore(StoreConfig(url="memory://"), run_id="study")
        await store.start()
        for rec in records:
            store.record(rec)
        await store.flush()
        rows_max, tick.ROWS_MAX = tick.ROWS_MAX, 0  # type: ignore[misc]
        try:
            result = await tick.compute_stats(
                store,
                run_id="study",
                stats_cfg=StatsConfig(windows_s=(None,), resamples=resamples),
                warmup=NO_WARMUP,
                window_end=end,
            )
        finally:
            tick.ROWS_MAX = rows_max  # type: ignore[misc]
            await store.close()
        window = result["results"]["all"]["all"]
        assert window["source"] == "summaries"
        found = window["conditions"]
        assert found is not None
        return found

    return asyncio.run(run())


def summaries_category_coverage(runs: int, resamples: int = 300) -> float:
    hits = total = 0
    for seed in range(runs):
        arms = category_run(seed)
        records = [
            _record(i, arm, T0 + (float(unit) + 0.5) * 60.0, float(tpot), category=str(cat))
            for arm, columns in zip(("baseline", "speculative"), arms, strict=True)
            for i, (unit, tpot, cat) in enumerate(
                zip(columns["unit"], columns["tpot_s"], columns["category"], strict=True)
            )
        ]
        found = from_summaries(records, T0 + 60 * 60.0, resamples)
        for band in found["segments"]["category"]["tpot"]:
            lo, hi = band["lower"], band["upper"]
            assert lo is not None and hi is not None
            hits += lo <= CATEGORY_SPEEDUPS[band["band"]] <= hi
            total += 1
    return hits / total


def summaries_crossover(seed: int, resamples: int = 500) -> tuple[float | None, float, float]:
    """(estimate, lower, upper) of the TPOT crossover from the store's load keys."""
    rows, span = emulated_rows(seed)
    # the run over 59 minute units: within the hour the conditions' rollups are kept
    minutes = CONDITION_MINUTES - 1
    stretch = minutes * 60.0 / span
    records = [
        _record(i, "speculative" if spec else "baseline", T0 + t * stretch, tpot,
                endpoint_in_flight=int(level))
        for spec, arm_rows in rows.items()
        for i, (t, level, tpot) in enumerate(arm_rows)
    ]  # fmt: skip
    found = from_summaries(records, T0 + minutes * 60.0, resamples)["crossover"]["tpot"]
    lo = found["lower"] if found["lower"] is not None else -math.inf
    hi = found["upper"] if found["upper"] is not None else math.inf
    return found["load"], lo, hi


def _report(
    name: str, truth: float, runs: int, one: Callable[[int], tuple[float | None, float, float]]
) -> None:
    started = time.perf_counter()
    hits = 0
    estimates, widths = [], []
    for run in range(runs):
        load, lo, hi = one(run)
        hits += lo <= truth <= hi
        if load is not None:
            estimates.append(load)
        widths.append(hi - lo)
    share = hits / runs
    print(
        f"crossover ({name}): truth {truth:.2f}; coverage {share:.3f} (SE "
        f"{math.sqrt(share * (1 - share) / runs):.3f}) of {runs} runs; estimate mean "
        f"{np.mean(estimates):.2f} sd {np.std(estimates):.2f}; median width "
        f"{np.median(widths):.2f} [{time.perf_counter() - started:.0f} s]"
    )


def _from_rows(run: int) -> tuple[float | None, float, float]:
    control, treatment = emulated_window(run)
    found = crossover(control, treatment, units=200, rng=np.random.default_rng(run), resamples=500)
    lo = found.lower if found.lower is not None else -math.inf
    hi = found.upper if found.upper is not None else math.inf
    return found.load, lo, hi


def _coverage_line(name: str, c: float, n: int, started: float) -> None:
    print(
        f"categories ({name}): coverage {c:.3f} (SE {math.sqrt(c * (1 - c) / n):.3f}) of {n}"
        f" intervals [{time.perf_counter() - started:.0f} s]"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--category-runs", type=int, default=200)
    parser.add_argument("--crossover-runs", type=int, default=30)
    parser.add_argument("--summaries-category-runs", type=int, default=0)
    parser.add_argument("--summaries-runs", type=int, default=0, help="crossover runs")
    args = parser.parse_args()

    started = time.perf_counter()
    if args.category_runs:
        c = category_coverage(args.category_runs)
        _coverage_line("rows", c, 3 * args.category_runs, started)
    if args.summaries_category_runs:
        started = time.perf_counter()
        c = summaries_category_coverage(args.summaries_category_runs)
        _coverage_line("summaries", c, 3 * args.summaries_category_runs, started)

    truth = crossover_concurrency(
        SPECULATIVE, BASELINE, low=1, high=64, requests=4000, max_tokens=MAX_TOKENS
    )
    assert truth is not None
    if args.crossover_runs:
        _report("rows", truth, args.crossover_runs, _from_rows)
    if args.summaries_runs:
        _report("summaries", truth, args.summaries_runs, summaries_crossover)


if __name__ == "__main__":
    main()
