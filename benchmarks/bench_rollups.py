"""Cost of one stats tick (every window) read from per-minute rollups, and from raw rows.

Rollups are built directly (no requests): for every minute, arm and metric, `rate * 60` lognormal
latencies binned on the fixed grid (`specproxy.loggrid`), upserted with the stores' own SQL. Then
one `compute_stats` runs with `raw_rows_max=0` (rollup path), and with `--raw-rows N` a second
store gets N records through `record()` and one row-path tick is timed.

    .venv/bin/python benchmarks/bench_rollups.py --minutes 360 --rate 10
    .venv/bin/python benchmarks/bench_rollups.py --minutes 360 --rate 10 --url postgresql://...
    .venv/bin/python benchmarks/bench_rollups.py --minutes 0 --raw-rows 43000

Printed: rollup rows written, wall and CPU seconds of the tick, peak RSS of the process.
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import sqlite3
import tempfile
import time
from pathlib import Path

import asyncpg
import numpy as np

from specproxy.config import ScrapeConfig, StatsConfig, StoreConfig
from specproxy.loggrid import bin_index
from specproxy.records import Arm, RequestRecord
from specproxy.rollup import ROLLUP_METRICS, BinRow, SummaryRow
from specproxy.stats.job import compute_stats
from specproxy.store.buffered import BufferedStore
from specproxy.store.factory import open_store
from specproxy.store.rollups import upsert_bins_sql, upsert_minutes_sql

RUN = "bench"
FIRST_MINUTE = 29_000_000  # ~2025


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _minute_rows(
    rng: np.random.Generator, minute: int, arm: Arm, metric: str, n: int, shift: float
) -> tuple[SummaryRow, list[BinRow]]:
    values = np.exp(rng.normal(shift, 0.5, n))
    bins, counts = np.unique(bin_index(values), return_counts=True)
    summary = (RUN, minute, "m", arm.value, metric, n, float(values.sum()), float(values @ values))
    rows = [
        (RUN, minute, "m", arm.value, metric, int(b), int(c))
        for b, c in zip(bins, counts, strict=True)
    ]
    return summary, rows


def _write_sqlite(url: str, summaries: list[SummaryRow], bins: list[BinRow]) -> None:
    with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
        lite.executemany(upsert_minutes_sql("sqlite"), summaries)
        lite.executemany(upsert_bins_sql("sqlite"), bins)


async def _write_postgres(url: str, summaries: list[SummaryRow], bins: list[BinRow]) -> None:
    pg = await asyncpg.connect(url)
    try:
        await pg.executemany(upsert_minutes_sql("postgresql"), summaries)
        await pg.executemany(upsert_bins_sql("postgresql"), bins)
    finally:
        await pg.close()


async def _build(store: BufferedStore, url: str, minutes: int, rate: float) -> int:
    """Write the rollups with the backend's own additive upserts; returns bin rows written."""
    rng = np.random.default_rng(0)
    per_minute = round(rate * 60)
    dialect = "sqlite" if url.startswith("sqlite") else "postgresql"
    written = 0
    for start in range(0, minutes, 30):
        summaries: list[SummaryRow] = []
        bins: list[BinRow] = []
        for minute in range(FIRST_MINUTE + start, FIRST_MINUTE + min(start + 30, minutes)):
            for arm, shift in ((Arm.BASELINE, 0.0), (Arm.SPECULATIVE, -0.2)):
                for metric in ROLLUP_METRICS:
                    s, b = _minute_rows(rng, minute, arm, metric, per_minute, shift)
                    summaries.append(s)
                    bins.extend(b)
        written += len(bins)
        if dialect == "sqlite":
            _write_sqlite(url, summaries, bins)
        else:
            await _write_postgres(url, summaries, bins)
    return written


async def _tick(store: BufferedStore, cfg: StatsConfig, end: float) -> tuple[float, float, str]:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    result = await compute_stats(
        store, run_id=RUN, stats_cfg=cfg, scrape_cfg=ScrapeConfig(), window_end=end
    )
    return time.perf_counter() - wall0, time.process_time() - cpu0, result.get("source", "?")


def _record(i: int, rng: np.random.Generator, t0: float) -> RequestRecord:
    arm = Arm.SPECULATIVE if i % 2 else Arm.BASELINE
    e2e = float(rng.lognormal(0.0 if arm is Arm.BASELINE else -0.2, 0.5))
    return RequestRecord(
        request_id=f"q{i}",
        run_id=RUN,
        arm=arm,
        t_start=t0 + i * 0.05,
        model="m",
        endpoint="completions",
        stream=True,
        status=200,
        e2e_s=e2e,
        upstream_s=e2e,
        ttft_s=e2e / 5,
        tpot_s=e2e / 100,
        prompt_tokens=20,
        output_tokens=100,
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=int, default=360)
    parser.add_argument("--rate", type=float, default=10.0, help="requests/s per arm")
    parser.add_argument("--url", default=None, help="store URL (default: a temporary SQLite)")
    parser.add_argument("--raw-rows", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=2000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-rollups-"))
    windows = (300.0, 3600.0, None)
    if args.minutes:
        url = args.url or f"sqlite:///{tmp}/rollups.db"
        store = open_store(StoreConfig(url=url, spill_path=str(tmp / "spill.jsonl")), run_id=RUN)
        await store.start()
        t0 = time.perf_counter()
        rows = await _build(store, url, args.minutes, args.rate)
        print(
            f"built {args.minutes} minutes x 2 arms x 3 metrics at {args.rate:g} req/s/arm: "
            f"{rows:,} bin rows ({rows / (args.minutes * 6):.0f} per minute-arm-metric) "
            f"in {time.perf_counter() - t0:.1f} s"
        )
        cfg = StatsConfig(windows_s=windows, resamples=args.resamples, raw_rows_max=0)
        end = (FIRST_MINUTE + args.minutes) * 60.0
        rss0 = _rss_mb()
        wall, cpu, source = await _tick(store, cfg, end)
        print(
            f"tick ({source}, windows 5m/1h/all, {args.resamples} resamples): wall {wall:.2f} s, "
            f"CPU {cpu:.2f} s, peak RSS {_rss_mb():.0f} MB (before the tick {rss0:.0f} MB)"
        )
        await store.close()
    if args.raw_rows:
        url = f"sqlite:///{tmp}/rows.db"
        store = open_store(StoreConfig(url=url, spill_path=str(tmp / "spill2.jsonl")), run_id=RUN)
        await store.start()
        rng = np.random.default_rng(1)
        t0 = 1_700_000_000.0
        for i in range(args.raw_rows):
            store.record(_record(i, rng, t0))
        await store.flush()
        cfg = StatsConfig(windows_s=windows, resamples=args.resamples)
        wall, cpu, source = await _tick(store, cfg, t0 + args.raw_rows * 0.05)
        print(
            f"tick ({source}) at {args.raw_rows:,} raw rows: wall {wall:.2f} s, CPU {cpu:.2f} s, "
            f"peak RSS {_rss_mb():.0f} MB"
        )
        await store.close()


if __name__ == "__main__":
    asyncio.run(main())
