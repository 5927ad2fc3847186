"""Store benchmark: insert throughput (SQLite, PostgreSQL) and the time to read 1M records per arm.

    .venv/bin/python benchmarks/bench_store.py [--rows-per-arm 1000000] [--no-postgres]

Inserts go through the real path: `record()` on the event loop, batched flushes, one transaction
per batch (`batch_size` 2000). PostgreSQL is a throw-away cluster from the Debian package with
fsync on. Reads are `read_records` of one run, both arms, with the columns the stats job uses,
then converted to arrays (`summary.rows`), as the stats job does. CPU time is this process's
plus its children's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.store.pgcluster

from tests.store.pgcluster import PgCluster, find_pg_bin

from specproxy.config import StoreConfig
from specproxy.records import RequestRecord
from specproxy.store.buffered import BufferedStore
from specproxy.store.factory import open_store
from specproxy.summary.rows import records_to_arrays

NUMERIC = ["t_start", "e2e_s", "ttft_s", "tpot_s", "output_tokens"]
WITH_TEXT = [*NUMERIC, "model", "pair_id", "shadow"]


def records(n_per_arm: int) -> list[RequestRecord]:
    t0 = time.time() - 3600
    out = []
    for i in range(2 * n_per_arm):
        out.append(
            RequestRecord(
                request_id=f"r{i}",
                run_id="bench",
                arm="speculative" if i % 2 else "baseline",
                t_start=t0 + i * 1e-3,
                model="tiny",
                endpoint="chat.completions",
                stream=True,
                status=200,
                e2e_s=1.0 + (i % 97) / 100,
                upstream_s=0.95,
                ttft_s=0.05,
                tpot_s=0.01 if i % 5 else None,
                prompt_tokens=100,
                output_tokens=128,
                n_events=64,
                tokens_per_event=2.0,
                mean_gap_s=0.02,
                max_gap_s=0.1,
                pair_id=f"p{i // 2}" if i % 10 == 0 else None,
            )
        )
    return out


async def bench_backend(name: str, url: str, rows: list[RequestRecord], spill: Path) -> None:
    cfg = StoreConfig(url=url, spill_path=str(spill), max_buffer=len(rows) + 1)
    store: BufferedStore = open_store(cfg, run_id="bench")
    await store.start()
    t0 = time.perf_counter()
    for rec in rows:
        store.record(rec)
    t_record = time.perf_counter() - t0
    await store.flush()
    t_total = time.perf_counter() - t0
    print(
        f"{name:10s} insert {len(rows):>9,d} rows: {len(rows) / t_total:>9,.0f} rows/s "
        f"(record() {t_record / len(rows) * 1e6:.2f} us/call on the loop, dropped={store.dropped})"
    )
    for label, columns in (("numeric", NUMERIC), ("+text", WITH_TEXT)):
        t0, c0 = time.perf_counter(), cpu_seconds()
        records = await store.read_records(run_id="bench", columns=columns)
        t_read = time.perf_counter() - t0
        arrays = records_to_arrays(columns, records)
        dt, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        sizes = {arm: len(a["t_start"]) for arm, a in arrays.items()}
        print(
            f"{name:10s} read_records {label:8s} {len(columns)} cols {sizes}: "
            f"{dt / 2:.2f} s wall ({t_read / 2:.2f} s reading), {cpu / 2:.2f} s CPU per arm "
            f"(load {load()})"
        )
    await store.close()


def cpu_seconds() -> float:
    """CPU of this process and of its live children, from /proc."""
    total = time.process_time()
    tick = os.sysconf("SC_CLK_TCK")
    for children in Path("/proc/self/task").glob("*/children"):
        for pid in children.read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return total


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


async def main(args: argparse.Namespace) -> None:
    rows = records(args.rows_per_arm)
    with tempfile.TemporaryDirectory(prefix="bench-store-") as tmp:
        await bench_backend("sqlite", f"sqlite:///{tmp}/bench.db", rows, Path(tmp) / "spill")
        if args.no_postgres:
            return
        initdb = find_pg_bin("initdb")
        if initdb is None:
            print("postgres: initdb not found, skipped")
            return
        cluster = PgCluster(initdb, fsync=True)
        try:
            cluster.start()
            await bench_backend("postgresql", cluster.url, rows, Path(tmp) / "spill-pg")
        finally:
            cluster.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows-per-arm", type=int, default=1_000_000)
    parser.add_argument("--no-postgres", action="store_true")
    print(f"cpus={os.cpu_count()} load={load()}")
    asyncio.run(main(parser.parse_args()))
