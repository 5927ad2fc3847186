"""Cost of a stats tick's engine-sample part: every sample read and summarised in Python (the
old path) against the store's aggregates and restart evidence (`SummaryReader.read_engine`).

The run: `--days` of one engine sample per arm per `--replicas` scraping proxy every 5 s (the
default `scrape.interval_s`), both arms (the speculative one with acceptance and 4 per-position
rates), an outage with failed scrapes and a restart every `--restart-every-h` hours per arm;
written with the store's own insert path. Then, in a fresh child process (a new leader: nothing
cached in it, the database file or server warm from the build), for the windows 5m, 1h and all:
  * old: `read_engine_samples` + `clean.restart_times` + `diagnosis.summarise_arms` per window;
  * new: twice (cold, then warm) the store's aggregates + restart samples + the same summaries.
Printed: wall and CPU s of this process (PostgreSQL's own CPU is not in it), peak RSS, and
whether both paths give the same restarts and summaries (means within 1e-12 relative).

    .venv/bin/python benchmarks/bench_engine.py --days 30          # SQLite
    .venv/bin/python benchmarks/bench_engine.py --days 30 --pg     # PostgreSQL
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import resource
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.store.pgcluster

from tests.store.pgcluster import PgCluster, find_pg_bin

from specproxy.config import StoreConfig
from specproxy.records import Arm, EngineSample
from specproxy.stats.diagnosis import EngineSummary, summarise_arms
from specproxy.stats.warmup import restart_times
from specproxy.store.factory import open_store
from specproxy.summary.engine import MEAN_FIELDS

RUN = "bench"
INTERVAL_S = 5.0
T0 = 1_740_000_000.0
WINDOWS = (300.0, 3600.0, None)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _samples(arm: Arm, lo: int, hi: int, replicas: int, restart_every: int) -> list[EngineSample]:
    """Samples lo..hi-1 (scrape index) of `arm`; replica r scrapes at its own phase."""
    rng = np.random.default_rng(lo * 2 + (arm == "speculative"))
    spec = arm == "speculative"
    out = []
    for i in range(lo, hi):
        phase = i % restart_every
        up = not (restart_every - 3 <= phase)  # the last 3 scrapes before a restart fail
        restarted = phase == 0 and i > 0
        for r in range(replicas):
            t = T0 + i * INTERVAL_S + r * INTERVAL_S / replicas
            rate = float(rng.uniform(0.5, 0.8))
            out.append(
                EngineSample(
                    t=t,
                    run_id=RUN,
                    arm=arm,
                    up=up,
                    restarted=restarted and up,
                    acceptance_rate=rate if spec and up else None,
                    mean_acceptance_length=1 + 4 * rate if spec and up else None,
                    position_acceptance=(0.9, 0.7, 0.5, 0.3) if spec and up else None,
                    requests_running=float(rng.integers(0, 64)) if up else None,
                    requests_waiting=0.0 if up else None,
                    kv_cache_usage=float(rng.uniform(0, 1)) if up else None,
                    generation_tokens_per_s=1000.0 if up else None,
                    process_start_time=t - 1.0 if restarted else T0,
                )
            )
    return out


async def _build(url: str, days: float, replicas: int, restart_every_h: float, spill: str) -> int:
    store = open_store(StoreConfig(url=url, spill_path=spill), run_id=RUN)
    await store.start()
    n = int(days * 86400 / INTERVAL_S)
    restart_every = max(4, int(restart_every_h * 3600 / INTERVAL_S))
    step = 20_000
    try:
        for lo in range(0, n, step):
            for arm in ("speculative", "baseline"):
                batch = _samples(arm, lo, min(n, lo + step), replicas, restart_every)
                await store._write([], batch, [])  # the backend's own insert
    finally:
        await store.close()
    return n * replicas


async def _timed(label: str, fn: Callable[[], Awaitable[Any]]) -> Any:
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = await fn()
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    print(f"  {label}: wall {wall:.2f} s, CPU {cpu:.2f} s, peak RSS {_rss_mb():.0f} MB", flush=True)
    return out


def _same(a: dict[Arm, EngineSummary], b: dict[Arm, EngineSummary]) -> bool:
    for arm in ("speculative", "baseline"):
        x, y = a[arm], b[arm]
        for f in ("samples", "restarts", "up_samples", "num_speculative_tokens"):
            if getattr(x, f) != getattr(y, f):
                return False
        for f in MEAN_FIELDS:
            u, v = getattr(x, f), getattr(y, f)
            if (u is None) != (v is None) or (
                u is not None and not math.isclose(u, v, rel_tol=1e-12)
            ):
                return False
    return True


async def _ticks(url: str, spill: str, end: float) -> None:
    store = open_store(StoreConfig(url=url, spill_path=spill), run_id=RUN)
    await store.start()
    starts = [-math.inf if w is None else end - w for w in WINDOWS]
    try:

        async def old() -> tuple[dict[Arm, list[float]], list[dict[Arm, EngineSummary]]]:
            samples = await store.read_engine_samples(run_id=RUN)
            restarts = {arm: restart_times(samples, arm) for arm in ("speculative", "baseline")}
            return restarts, [summarise_arms(samples, None, since=s) for s in starts]

        async def new() -> tuple[dict[Arm, list[float]], list[dict[Arm, EngineSummary]]]:
            view = await store.read_engine(run_id=RUN, since=starts)
            restarts = {
                arm: restart_times(view.restart_samples, arm) for arm in ("speculative", "baseline")
            }
            return restarts, [summarise_arms(view, None, since=s) for s in starts]

        fresh = await _timed("new, cold (new leader)", new)
        await _timed("new, warm (next tick)  ", new)
        before = await _timed("old: every sample     ", old)
        same = fresh[0] == before[0] and all(
            _same(a, b) for a, b in zip(fresh[1], before[1], strict=True)
        )
        n = sum(len(r) for r in before[0].values())
        print(f"  same restarts ({n}) and summaries: {same}", flush=True)
    finally:
        await store.close()


def _child(url: str, spill: str, end: float) -> None:
    asyncio.run(_ticks(url, spill, end))


def _store_url(pg: bool, tmp: Path) -> tuple[str, PgCluster | None]:
    """A SQLite file in `tmp`, or a database on a throw-away PostgreSQL cluster (close it)."""
    initdb = find_pg_bin("initdb") if pg else None
    if not pg:
        return f"sqlite:///{tmp}/engine.db", None
    if initdb is None:
        raise SystemExit("no initdb: scripts/sysdeps.sh installs PostgreSQL")
    cluster = PgCluster(initdb)
    cluster.start()
    return cluster.create_database("bench"), cluster


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--replicas", type=int, default=1, help="scraping proxies")
    parser.add_argument("--restart-every-h", type=float, default=24.0)
    parser.add_argument("--pg", action="store_true", help="a throw-away PostgreSQL cluster")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    url, cluster = _store_url(args.pg, tmp)
    try:
        t0 = time.perf_counter()
        n = await _build(url, args.days, args.replicas, args.restart_every_h, str(tmp / "s0"))
        print(
            f"{'PostgreSQL' if args.pg else 'SQLite'}: {n:,} samples per arm "
            f"({args.days:g} days, {args.replicas} replica(s), 5 s), built in "
            f"{time.perf_counter() - t0:.0f} s; windows 5m, 1h, all:",
            flush=True,
        )
        end = T0 + args.days * 86400
        child = multiprocessing.get_context("spawn").Process(
            target=_child, args=(url, str(tmp / "s1"), end)
        )
        child.start()
        child.join()
    finally:
        if cluster is not None:
            cluster.close()


if __name__ == "__main__":
    asyncio.run(main())
