"""Cost of one stats tick (every window) on a run's rollup tiers, and of a tick on raw rows.

Steady state built directly (no requests), as the stats leader's compaction leaves it at `now`
with `summary.tiering.FINE_MINUTES` (6) and `MINUTE_HOURS` (3):
  * hour blocks for every whole hour before the minute tier (coarse 0.5 % histograms, drawn as a
    multinomial of `rate * 3600` requests per hour from a lognormal whose median follows a daily
    load wave);
  * 1-minute blocks for the minutes after that, up to `now - 6 min`;
  * fine 0.02 % rows for the last 6 minutes and the current one (real lognormal draws, written
    with the stores' own SQL: these are the rows replicas upsert).
Both arms (speculative 20 % faster), three metrics. Then, in a fresh child process (so its peak
RSS is the tick's and not the build's), as `StatsJob.run_once` does (`compute_stats` with the
job's cache and its one computing thread, then the compaction pass, after the result):
  1. a cold tick (a new leader: empty cache);
  2. a warm tick after 15 s more traffic in the current minute;
  3. a warm tick one minute later (one more minute of traffic; a minute leaves the fine tier, so
     the compaction pass after it moves ~70k fine rows at 1k req/s);
  4. the tick after that compaction (its read picks up the blocks the pass wrote).
The ticks run as the stats process runs them (`specproxy stats --follow`, serve's child): with
one BLAS thread (`OPENBLAS_NUM_THREADS=1`, as serve sets it for its child unless the operator
chose; with one per core, the CPU-s nearly double) and glibc's default malloc thresholds.
Printed per tick: wall s to the result (and of it: the cache refresh, with its store reads and
decoding them into the job's cache, which overlap; the rest: the statistics), CPU s of this
process (PostgreSQL's own CPU is not in it), rows and blobs read, the compaction pass's wall s
and rows after the result, and the child's peak RSS.

    .venv/bin/python benchmarks/bench_rollups.py --days 30 --rate 1000            # SQLite
    .venv/bin/python benchmarks/bench_rollups.py --days 30 --rate 1000 --pg       # PostgreSQL
    .venv/bin/python benchmarks/bench_rollups.py --days 0 --raw-rows 43000        # raw rows
    .venv/bin/python benchmarks/bench_rollups.py --days 30 --rate 1000 --conditions

With --conditions the requests state their conditions (issue 26): the store also holds the
condition keys' rollups (`summary.conditions`, `CONDITION_SHARES`: 26 keys per metric) as
compaction leaves them (their last hour, in 1-minute blocks and fine minutes), and the
whole-run window computes the speedups by condition from them.

With --raw-rows N: N records through `record()` into a SQLite store, then two row-path ticks and
one tick of the same run from its summaries (`tick.ROWS_MAX` set to 0 for it).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import resource
import sqlite3
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.store.pgcluster

from tests.store.pgcluster import PgCluster, find_pg_bin

from specproxy.config import StatsConfig, StoreConfig
from specproxy.records import Arm, RequestRecord
from specproxy.stats.job import tick
from specproxy.stats.job.cache import RollupCache
from specproxy.stats.job.supervisor import BLAS_VARIABLES
from specproxy.stats.job.tick import compute_stats
from specproxy.store.aggregates import (
    ROLLUP_BINS,
    ROLLUP_MINUTES,
    ROLLUP_MOMENT_HOURS,
    ROLLUP_MOMENTS,
    upsert_sql,
)
from specproxy.store.factory import open_store
from specproxy.store.rollups import upsert_block_sql
from specproxy.summary.blocks import Block
from specproxy.summary.compaction import fold
from specproxy.summary.grid import COARSE_FACTOR, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_index, coarse_as_fine, coarse_bin
from specproxy.summary.tiering import HOUR_SPAN, CompactionBounds

RUN = "bench"
SIGMA = 0.5
# metric -> log-median of the baseline (e2e ~ 1 s, ttft ~ 0.2 s, tpot ~ 10 ms)
METRIC_MU = {"e2e": 0.0, "ttft": -1.6, "tpot": -4.6}
ARM_SHIFT = {"baseline": 0.0, "speculative": -0.2}
WINDOWS = (300.0, 3600.0, None)
# --conditions: each request's conditions as summary keys (`summary.conditions`), a traffic mix
# of 26 keys per metric: loads 1-31 (15 keys), two prompt and two output bands, two
# temperatures, four categories; each dimension's shares sum to 1
CONDITION_SHARES: dict[str, float] = {
    **{f"load={k}": 1 / 15 for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28)},
    "prompt=<128": 0.3, "prompt=128-511": 0.7,
    "output=32-127": 0.5, "output=128-511": 0.5,
    "temperature=0": 0.4, "temperature=default": 0.6,
    "category=code": 0.4, "category=chat": 0.3, "category=math": 0.2, "category=rag": 0.1,
}  # fmt: skip
CONDITION_MU = {"cond_e2e": METRIC_MU["e2e"], "cond_tpot": METRIC_MU["tpot"]}


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _wave(minute: int) -> float:
    """Log-median shift of a minute: a daily load wave of +-10 %."""
    return 0.1 * math.sin(2 * math.pi * minute / 1440)


def _coarse_block(
    rng: np.random.Generator, start: int, span: int, per_minute: int, mu: float
) -> Block:
    """A block of `span` minutes drawn on the coarse grid (multinomial over coarse bins)."""
    width = COARSE_FACTOR * GRID_LOG_WIDTH
    lo = math.floor((mu - 6 * SIGMA) / width)
    hi = math.ceil((mu + 6 * SIGMA) / width)
    edges = (np.arange(lo, hi + 1) * width - mu) / SIGMA
    cdf = 0.5 * (1 + np.vectorize(math.erf)(edges / math.sqrt(2)))
    probs = np.diff(cdf)
    n = per_minute * span
    counts = rng.multinomial(n, probs / probs.sum())
    mean = math.exp(mu + SIGMA**2 / 2)
    return Block(
        start,
        span,
        np.full(span, per_minute, dtype=np.int64),
        np.full(span, per_minute * mean),
        np.full(span, per_minute * mean**2 * math.exp(SIGMA**2)),
        lo,
        counts.astype(np.int64),
    )


def _keys(conditions: bool) -> list[tuple[str, str, float, float]]:
    """(metric, key, share of the requests, log-median) of every rollup key."""
    keys = [(metric, "m", 1.0, mu) for metric, mu in METRIC_MU.items()]
    if conditions:
        keys += [
            (metric, key, share, mu)
            for metric, mu in CONDITION_MU.items()
            for key, share in CONDITION_SHARES.items()
        ]
    return keys


def _fine_rows(
    rng: np.random.Generator, minute: int, n: int, conditions: bool = False
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """Fine summary and bin rows of `n` requests per arm in one minute (every metric; the
    conditions' on the coarse grid, as the writer bins them)."""
    summaries: list[tuple[Any, ...]] = []
    bins: list[tuple[Any, ...]] = []
    for arm, shift in ARM_SHIFT.items():
        for metric, key, share, mu in _keys(conditions):
            k = max(1, round(n * share))
            v = np.exp(rng.normal(mu + shift + _wave(minute), SIGMA, k))
            summaries.append((RUN, metric, minute, key, arm, k, float(v.sum()), float(v @ v)))
            fine = bin_index(v)
            if key != "m":
                fine = coarse_as_fine(coarse_bin(fine))
            b, c = np.unique(fine, return_counts=True)
            bins.extend(
                (RUN, metric, minute, key, arm, int(i), int(c)) for i, c in zip(b, c, strict=True)
            )
    return summaries, bins


def _moment_rows(start: int, span: int, per_minute: int, mu: float, arm: Arm) -> tuple[Any, ...]:
    """A (run, start, model, arm, *MOMENT_SUMS) row of `span` minutes: the expected sums of
    log E2E ~ N(mu, SIGMA^2) beside log output ~ N(4.5, 0.5) and log prompt ~ N(6, 1) tokens
    (E2E rising 0.3 per unit of log output): a proper regression's sums."""
    n = per_minute * span
    u, v, y = 4.5, 6.0, mu  # means; cov(u, y) = 0.3 x var(u) = 0.15
    return (
        RUN, start, "m", arm, n, n * u, n * v, n * (u * u + 0.5), n * (v * v + 1.0),
        n * u * v, n * y, n * (u * y + 0.15), n * v * y, n * (y * y + SIGMA**2),
    )  # fmt: skip


async def _execute(url: str, sql: dict[str, list[tuple[Any, ...]]]) -> None:
    """Run each statement over its rows in one transaction, with the backend's own driver."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as lite:
            for statement, rows in sql.items():
                lite.executemany(statement, rows)
        return
    import asyncpg

    pg = await asyncpg.connect(url)
    try:
        async with pg.transaction():
            for statement, rows in sql.items():
                if rows:
                    await pg.executemany(statement, rows)
    finally:
        await pg.close()


def _dialect(url: str) -> Any:
    return "sqlite" if url.startswith("sqlite") else "postgresql"


async def _write_fine(
    url: str, rng: np.random.Generator, minute: int, n: int, conditions: bool = False
) -> int:
    summaries, bins = _fine_rows(rng, minute, n, conditions)
    d = _dialect(url)
    await _execute(
        url, {upsert_sql(ROLLUP_MINUTES, d): summaries, upsert_sql(ROLLUP_BINS, d): bins}
    )
    return len(bins)


async def build_rollups(
    url: str, days: float, rate: float, end_minute: int, conditions: bool = False
) -> None:
    """The steady state at minute `end_minute` (see the module docstring)."""
    rng = np.random.default_rng(0)
    per_minute = round(rate * 60)
    bounds = CompactionBounds.at(end_minute * 60.0)
    first = end_minute - round(days * 1440)
    first -= first % HOUR_SPAN
    t0 = time.perf_counter()
    blocks: list[tuple[Any, ...]] = []
    starts = [(s, HOUR_SPAN) for s in range(first, bounds.hours_before, HOUR_SPAN)]
    starts += [(s, 1) for s in range(bounds.hours_before, bounds.fine_before)]
    for start, span in starts:
        # the conditions' rollups: their last hour only, in 1-minute blocks (`tiering`)
        kept = conditions and span == 1 and start >= (bounds.conditions_before or 0)
        for arm, shift in ARM_SHIFT.items():
            for metric, key, share, mu in _keys(kept):
                n = max(1, round(per_minute * share))
                b = _coarse_block(rng, start, span, n, mu + shift + _wave(start))
                blocks.append((RUN, metric, start, span, key, arm, b.n, b.encode()))
    # the length adjustment's moments (schema v8): a row per minute of the whole run and a row
    # per hour, as the writes leave them (nothing compacts them)
    e2e_mu = METRIC_MU["e2e"]
    minute_rows = [
        _moment_rows(m, 1, per_minute, e2e_mu + shift + _wave(m), arm)
        for m in range(first, end_minute + 1)
        for arm, shift in ARM_SHIFT.items()
    ]
    hour_rows = [
        _moment_rows(h, HOUR_SPAN, per_minute, e2e_mu + shift + _wave(h), arm)
        for h in range(first, end_minute + 1, HOUR_SPAN)
        for arm, shift in ARM_SHIFT.items()
    ]
    dialect = _dialect(url)
    await _execute(
        url,
        {
            upsert_block_sql(dialect): blocks,
            upsert_sql(ROLLUP_MOMENTS, dialect): minute_rows,
            upsert_sql(ROLLUP_MOMENT_HOURS, dialect): hour_rows,
        },
    )
    fine = 0
    for minute in range(bounds.fine_before, end_minute + 1):
        # the current minute is half full
        n = per_minute if minute < end_minute else per_minute // 2
        fine += await _write_fine(url, rng, minute, n, conditions)
    requests = (end_minute - first) * per_minute * 2 + per_minute // 2 * 2
    print(
        f"built {len(blocks):,} blocks ({len(starts):,} per arm and metric) and {fine:,} fine bin "
        f"rows: {requests / 1e9:.2f}B requests over {(end_minute - first) / 1440:.1f} days at "
        f"{rate:g} req/s per arm, in {time.perf_counter() - t0:.0f} s",
        flush=True,
    )


async def _tick(
    store: Any, cfg: StatsConfig, cache: RollupCache, now: float, pool: ThreadPoolExecutor
) -> str:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    read0, decode0, refresh0 = cache.read_s, cache.decode_s, cache.refresh_s
    result = await compute_stats(
        store,
        run_id=RUN,
        stats_cfg=cfg,
        window_end=now,
        cache=cache,
        executor=pool,
    )
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    read, decode = cache.read_s - read0, cache.decode_s - decode0
    refresh = cache.refresh_s - refresh0
    compact0 = time.perf_counter()
    moved = await store.compact(
        run_id=RUN, bounds=CompactionBounds.at(now), fold=fold
    )  # as StatsJob
    compaction = time.perf_counter() - compact0
    bounds = {
        label: f"{w.get('grid_error_bound', 0.0):.2%}"
        for label, w in result["results"]["all"].items()
    }
    sources = {label: w.get("source") for label, w in result["results"]["all"].items()}
    whole = result["results"]["all"]["all"].get("conditions")
    by_condition = (
        f"{sum(len(b['tpot']) for b in whole['segments'].values())} TPOT bands, crossover "
        f"{whole['crossover']['tpot']['status']}"
        if whole is not None
        else "none"
    )
    adjusted: dict[str, str | None] = {}
    for label, w in result["results"]["all"].items():
        adj = w["metrics"]["e2e"]["adjusted"]
        adjusted[label] = adj["method"] if adj is not None else None
    return (
        f"wall {wall:.2f} s (refresh {refresh:.2f}: store read {read:.2f}, decode {decode:.2f}; "
        f"the rest {wall - refresh:.2f}), CPU {cpu:.2f} s, read {cache.rows_read:,} rows/blobs, "
        f"then compaction {compaction:.2f} s ({moved:,} rows), sources {sources}, "
        f"grid bounds {bounds}, length adjustment {adjusted}, by condition: {by_condition}, "
        f"peak RSS {_rss_mb():.0f} MB, host load {os.getloadavg()[0]:.1f}"
    )


async def _ticks(
    url: str, rate: float, end_minute: int, resamples: int, spill: str, conditions: bool
) -> None:
    """The three ticks (module docstring), in this (child) process."""
    print(f"  child process before the ticks: peak RSS {_rss_mb():.0f} MB", flush=True)
    store = open_store(StoreConfig(url=url, spill_path=spill), run_id=RUN)
    await store.start()
    cfg = StatsConfig(windows_s=WINDOWS, resamples=resamples)
    cache = RollupCache()
    rng = np.random.default_rng(7)
    per_minute = round(rate * 60)
    pool = ThreadPoolExecutor(1)  # the job's own computing thread (`StatsJob`)
    try:
        now = end_minute * 60.0 + 30
        print(f"  cold tick:   {await _tick(store, cfg, cache, now, pool)}", flush=True)
        await _write_fine(url, rng, end_minute, per_minute // 4, conditions)  # 15 s more
        now += 15
        print(f"  warm tick:   {await _tick(store, cfg, cache, now, pool)}", flush=True)
        await _write_fine(url, rng, end_minute, per_minute // 4, conditions)
        await _write_fine(url, rng, end_minute + 1, per_minute // 2, conditions)
        now += 60
        print(f"  next minute: {await _tick(store, cfg, cache, now, pool)}", flush=True)
        await _write_fine(url, rng, end_minute + 1, per_minute // 4, conditions)
        now += 15
        print(f"  after that:  {await _tick(store, cfg, cache, now, pool)}", flush=True)
    finally:
        pool.shutdown()
        await store.close()


def _child(
    url: str, rate: float, end_minute: int, resamples: int, spill: str, conditions: bool
) -> None:
    asyncio.run(_ticks(url, rate, end_minute, resamples, spill, conditions))


def _record(i: int, rng: np.random.Generator, t0: float) -> RequestRecord:
    arm = "speculative" if i % 2 else "baseline"
    e2e = float(rng.lognormal(0.0 if arm == "baseline" else -0.2, 0.5))
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


async def _raw(rows: int, resamples: int, tmp: Path) -> None:
    url = f"sqlite:///{tmp}/rows.db"
    store = open_store(StoreConfig(url=url, spill_path=str(tmp / "spill2.jsonl")), run_id=RUN)
    await store.start()
    rng = np.random.default_rng(1)
    t0 = 1_700_000_000.0
    for i in range(rows):
        store.record(_record(i, rng, t0))
    await store.flush()
    # the rows source (a run at most `tick.ROWS_MAX` requests per arm), then the same run from
    # its summaries
    cfg = StatsConfig(windows_s=WINDOWS, resamples=resamples)
    cache = RollupCache()
    for label, rows_max in (("cold", tick.ROWS_MAX), ("warm", tick.ROWS_MAX), ("cold", 0)):
        setattr(tick, "ROWS_MAX", rows_max)  # noqa: B010 - a Final the benchmark overrides
        cpu0, wall0 = time.process_time(), time.perf_counter()
        result = await compute_stats(
            store, run_id=RUN, stats_cfg=cfg, window_end=t0 + rows * 0.05, cache=cache
        )
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        source = result["results"]["all"]["all"].get("source")
        print(
            f"{label} tick ({source}) at {rows:,} raw rows: wall {wall:.2f} s, "
            f"CPU {cpu:.2f} s, peak RSS {_rss_mb():.0f} MB"
        )
    await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s per arm")
    parser.add_argument("--pg", action="store_true", help="a throw-away PostgreSQL cluster")
    parser.add_argument("--raw-rows", type=int, default=0)
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument(
        "--conditions",
        action="store_true",
        help="requests state their conditions: the condition keys' rollups too",
    )
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-rollups-"))
    end_minute = 29_000_000  # ~2025
    if args.days:
        cluster = None
        if args.pg:
            initdb = find_pg_bin("initdb")
            if initdb is None:
                raise SystemExit("no initdb: scripts/sysdeps.sh installs PostgreSQL")
            cluster = PgCluster(initdb)
            cluster.start()
            url = cluster.create_database("bench")
        else:
            url = f"sqlite:///{tmp}/rollups.db"
        try:
            setup = open_store(StoreConfig(url=url, spill_path=str(tmp / "s0.jsonl")), run_id=RUN)
            await setup.start()  # creates the schema
            await setup.close()
            await build_rollups(url, args.days, args.rate, end_minute, args.conditions)
            print(f"ticks on {'PostgreSQL' if args.pg else 'SQLite'} (windows 5m, 1h, all):")
            child = multiprocessing.get_context("spawn").Process(
                target=_child,
                args=(
                    url,
                    args.rate,
                    end_minute,
                    args.resamples,
                    str(tmp / "s1.jsonl"),
                    args.conditions,
                ),
            )
            child.start()
            child.join()
        finally:
            if cluster is not None:
                cluster.close()
    if args.raw_rows:
        await _raw(args.raw_rows, args.resamples, tmp)


def one_blas_thread() -> None:
    """Run this benchmark again with one BLAS thread, as serve's stats process runs (its
    environment, `stats.job.supervisor`), unless the environment chose a number already."""
    if not any(name in os.environ for name in BLAS_VARIABLES):
        env = {**os.environ, **dict.fromkeys(BLAS_VARIABLES, "1")}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)


if __name__ == "__main__":
    one_blas_thread()
    asyncio.run(main())
