"""Issue 29's fault table: each case run against real `specproxy serve` processes on loopback,
printed as markdown (case, what the client saw, records kept, records lost, the proxy's RSS
before the fault and after it, with its peak).

The fault upstream (`tests/faults/upstream.py`), the clients and the store faults run in this
process; every proxy is its own `specproxy serve` (RSS from /proc: VmRSS, peak VmHWM; for
`--workers` the sum over the workers). "Lost" is what the proxy answered (a response the client
read) and did not store; a case without a store says so. Each case is bounded (`--case-timeout`,
and its own waits), runs in its own directory, and kills what it started.

    .venv/bin/python benchmarks/fault_table.py [--only NAME ...] [--case-timeout 300]

Timings in the table (latencies, CPU shares) come from whatever machine runs it: say which.
The DNS case needs `unshare` (a private /etc/hosts and host name per replica); without it, the
row says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.faults' rig

from tests.faults.serve_proc import Serve, refusal, serve_toml, stored_rows
from tests.faults.upstream import (
    BIG_SSE_BYTES,
    FaultUpstream,
    blackholed_url,
    padded_metrics_page,
)
from tests.proctree import descendants, wait_gone
from tests.store.pgcluster import PgCluster, find_pg_bin

from specproxy.config import StoreConfig
from specproxy.proxy.headers import REQUEST_ID_HEADER
from specproxy.proxy.limits import MAX_HEADER_BYTES
from specproxy.store.sqlite import EXIT_UNSAFE, SqliteStore

RUN = "faults"
CHAT = "/v1/chat/completions"
MiB = 1024 * 1024
TOKEN = "t" * 32


def chat(**extra: object) -> dict[str, object]:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], **extra}


@dataclass
class Row:
    case: str
    client: str
    records: str
    lost: str
    rss: str


def mib(n: int) -> str:
    return f"{n / MiB:.0f}"


def proc_mem(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process, in bytes."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) * 1024
    return fields["VmRSS"], fields["VmHWM"]


def rss_cell(before: int, after: int, peak: int | None = None) -> str:
    cell = f"{mib(before)} → {mib(after)} MiB"
    return cell + (f" (peak {mib(peak)})" if peak is not None else "")


def cpu_s(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def query(db: Path, sql: str, *args: object) -> list[tuple[Any, ...]]:
    if not db.exists():
        return []
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        return list(conn.execute(sql, args))


def store_toml(
    upstream: FaultUpstream, work: Path, extra: str = "", store: str = "", tables: str = ""
) -> str:
    """Both arms on `upstream`, a SQLite store in `work` (or `store`); `extra`: top-level keys,
    `tables`: more TOML tables."""
    return serve_toml(upstream.url, work, RUN, top=extra, store_url=store or None, tables=tables)


class Procs:
    """Every serve this run started: whatever a case leaves running is killed after it."""

    def __init__(self) -> None:
        self.started: list[Serve] = []

    def serve(self, work: Path, toml: str, **kw: Any) -> Serve:
        work.mkdir(parents=True, exist_ok=True)
        proc = Serve(work, toml, **kw)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            if proc.proc.poll() is None:
                for pid in [*children(proc.pid), proc.pid]:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                proc.proc.wait(30)
        self.started.clear()


async def stop(serve: Serve) -> int:
    """SIGTERM, then its exit status (killed after 120 s)."""
    if serve.proc.poll() is None:
        serve.proc.send_signal(signal.SIGTERM)
    try:
        return await serve.wait(120)
    except Exception:
        serve.proc.kill()
        return await serve.wait(30)


async def post(
    session: aiohttp.ClientSession,
    url: str,
    fault: str = "ok",
    stream: bool = False,
    **kw: Any,
) -> int | str:
    """The status the client read (body included), or the name of the error it got."""
    try:
        body = chat(stream=True) if stream else chat()
        async with session.post(url + CHAT, json=body, headers={"x-fault": fault}, **kw) as r:
            await r.read()
            return r.status
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return type(exc).__name__


def seen(counter: Counter[int | str]) -> str:
    return ", ".join(f"{n} x {k}" for k, n in sorted(counter.items(), key=lambda kv: -kv[1]))


async def until(check: Callable[[], Awaitable[bool] | bool], timeout_s: float) -> bool:
    """Poll `check` every 0.1 s until it is true or `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return True
        await asyncio.sleep(0.1)
    return False


# ------------------------------------------------------------------------------ the cases

# A case: (procs, the fault upstream, its own directory, its arguments) -> its row(s).
Case = Callable[..., Awaitable[Row | list[Row]]]


def environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text().split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


def workers_of(pid: int) -> list[int]:
    """The `--workers` children of serve `pid` (not its stats process), by worker index."""
    found = {}
    for kid in children(pid):
        with contextlib.suppress(OSError):
            index = environ(kid).get("SPECPROXY_WORKER_INDEX")
            if index is not None:
                found[int(index)] = kid
    return [found[i] for i in sorted(found)]


async def workers_up(serve: Serve, n: int) -> list[int]:
    """Until serve has `n` workers, each listening on its private socket."""

    def up() -> bool:
        kids = workers_of(serve.pid)
        if len(kids) != n:
            return False
        directory = Path(environ(kids[0])["SPECPROXY_WORKER_DIR"])
        return len(list(directory.glob("worker-*.sock"))) == n

    assert await until(up, 120), serve.log.read_text()[-2000:]
    return workers_of(serve.pid)


async def sigkill_worker(procs: Procs, up: FaultUpstream, work: Path, index: int) -> Row:
    """`serve --workers 3` on one SQLite store under closed-loop load; worker `index` gets
    SIGKILL 2 s in: the parent must stop the pod (its supervisor restarts it whole)."""
    serve = procs.serve(work, store_toml(up, work), args=["--workers", "3"])
    await serve.ready()
    kids = await workers_up(serve, 3)
    rss_before = sum(proc_mem(k)[0] for k in kids)
    statuses: Counter[int | str] = Counter()
    done = asyncio.Event()

    async def load() -> None:
        connector = aiohttp.TCPConnector(force_close=True)  # every worker gets some
        async with aiohttp.ClientSession(connector=connector) as session:
            while not done.is_set():
                status = await post(session, serve.url)
                statuses[status] += 1
                if not isinstance(status, int):
                    await asyncio.sleep(0.05)

    clients = [asyncio.create_task(load()) for _ in range(4)]
    await asyncio.sleep(2.0)
    mems = [proc_mem(k) for k in kids]
    tree = descendants(serve.pid)
    os.kill(kids[index], signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        status = await serve.wait(90)
        stopped_s = time.monotonic() - killed_at
    finally:
        done.set()
        await asyncio.gather(*clients)
    gone = not wait_gone(tree, timeout_s=30)
    answered = statuses[200]
    kept = len(stored_rows(work / "store.db", RUN))
    return Row(
        f"SIGKILL of worker {index + 1} of 3 (`--workers 3`, under load)",
        f"{seen(statuses)}; the pod exited {status} (the worker's -9) {stopped_s:.1f} s after "
        "the kill, "
        f"{'no process left' if gone else 'PROCESSES LEFT'}",
        f"{kept} stored",
        f"{answered - kept} (answered by the killed worker, not yet flushed)",
        rss_cell(rss_before, sum(m[0] for m in mems), sum(m[1] for m in mems)) + " (3 workers)",
    )


async def protected_metrics(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    serve = procs.serve(
        work,
        store_toml(up, work, "protect_metrics = true"),
        args=["--workers", "2"],
        env={"SPECPROXY_ADMIN_TOKEN": TOKEN},
    )
    await serve.ready()
    kids = await workers_up(serve, 2)
    rss_before = sum(proc_mem(k)[0] for k in kids)
    sent = 200
    statuses: Counter[int | str] = Counter()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True)) as session:
        for _ in range(sent):
            statuses[await post(session, serve.url)] += 1
    auth = {"Authorization": f"Bearer {TOKEN}"}
    scrapes: Counter[int | str] = Counter(
        [int(await serve.metric("specproxy_requests_total", headers=auth)) for _ in range(20)]
    )
    mems = [proc_mem(k) for k in kids]
    await stop(serve)
    kept = len(stored_rows(work / "store.db", RUN))
    return Row(
        "`protect_metrics = true` + `--workers 2`: 20 scrapes with the token",
        f"{seen(statuses)}; specproxy_requests_total on the scrapes: {seen(scrapes)}",
        f"{kept} stored",
        str(statuses[200] - kept),
        rss_cell(rss_before, sum(m[0] for m in mems), sum(m[1] for m in mems)) + " (2 workers)",
    )


async def slow_readers(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    """20 clients ask for a 20 MB stream and never read."""
    readers = 20
    serve = procs.serve(work, store_toml(up, work, tables="[timeouts]\nread_s = 120.0"))
    await serve.ready()
    rss_before = proc_mem(serve.pid)[0]
    body = json.dumps(chat(stream=True)).encode()
    request = (
        f"POST {CHAT} HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\n"
        f"x-fault: big_sse\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    writers = []
    start_streamed = up.streamed
    for _ in range(readers):
        _, writer = await asyncio.open_connection("127.0.0.1", serve.port)
        writer.write(request)  # and never a read
        writers.append(writer)
    last, still = -1, 0
    for _ in range(2400):  # until the engine's writes stall: 5 s without progress
        await asyncio.sleep(0.1)
        if up.streamed == last:
            still += 1
            if still == 50:
                break
        else:
            last, still = up.streamed, 0
    rss_held, peak = proc_mem(serve.pid)
    streamed = up.streamed - start_streamed
    for writer in writers:
        writer.transport.abort()
    db = work / "store.db"

    def recorded() -> bool:
        return len(stored_rows(db, RUN)) >= readers

    await until(recorded, 120)
    await stop(serve)
    kinds = Counter(kind for _, kind, _ in stored_rows(db, RUN))
    return Row(
        f"{readers} clients that do not read (a {BIG_SSE_BYTES // MiB} MB stream each)",
        f"read nothing; the engine wrote {streamed / MiB:.0f} of "
        f"{readers * BIG_SSE_BYTES / MiB:.0f} MiB before its writes stalled (the rest waits in "
        "the sockets); then they left",
        ", ".join(f"{n} x {k}" for k, n in kinds.items()),
        str(readers - sum(kinds.values())),
        rss_cell(rss_before, rss_held, peak),
    )


async def huge_event(procs: Procs, up: FaultUpstream, work: Path, strip: bool) -> Row:
    """One 100 MB SSE event; usage stripped (the client did not ask for it) or passed through."""
    serve = procs.serve(work, store_toml(up, work))
    await serve.ready()
    rss_before = proc_mem(serve.pid)[0]
    body = chat(stream=True) if strip else chat(stream=True, stream_options={"include_usage": True})
    received, first, cut = 0, None, ""
    started = time.monotonic()
    timeout = aiohttp.ClientTimeout(total=180)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.post(serve.url + CHAT, json=body, headers={"x-fault": "huge_event"}) as resp,
    ):
        try:
            async for chunk in resp.content.iter_any():
                if first is None:
                    first = time.monotonic() - started
                received += len(chunk)
        except aiohttp.ClientPayloadError as exc:
            cut = f", cut off ({type(exc).__name__})"
        status = resp.status
    total = time.monotonic() - started
    rss_after, peak = proc_mem(serve.pid)
    await stop(serve)
    kinds = Counter(kind for _, kind, _ in stored_rows(work / "store.db", RUN))
    first_cell = f"first byte {first:.2f} s, " if first is not None else "no body byte, "
    return Row(
        f"a 100 MB SSE event ({'usage stripped' if strip else 'include_usage: passed through'})",
        f"{status}, {received / MiB:.1f} MiB, {first_cell}ended at {total:.1f} s"
        f"{cut or ', clean end'}",
        ", ".join(f"{n} x {k}" for k, n in kinds.items()),
        str(1 - sum(kinds.values())),
        rss_cell(rss_before, rss_after, peak),
    )


async def shm_truncated(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    db = work / "store.db"
    serve = procs.serve(work, store_toml(up, work))
    await serve.ready()
    rss_before = proc_mem(serve.pid)[0]
    statuses: Counter[int | str] = Counter()
    async with aiohttp.ClientSession() as session:
        for _ in range(40):
            statuses[await post(session, serve.url)] += 1
        await until(lambda: len(stored_rows(db, RUN)) >= 40, 60)
        os.truncate(f"{db}-shm", 0)  # a cleanup job, a disk tool
        for _ in range(60):
            statuses[await post(session, serve.url)] += 1
    alive = serve.proc.poll() is None
    rss_after, peak = proc_mem(serve.pid)
    status = await stop(serve)
    critical = "CRITICAL" in serve.log.read_text()
    again = procs.serve(work, store_toml(up, work))
    await again.ready()
    await until(lambda: len(stored_rows(db, RUN)) >= statuses[200], 60)
    await stop(again)
    kept = len({r[0] for r in stored_rows(db, RUN)})
    return Row(
        "SQLite `-shm` truncated under load (40 requests before, 60 after)",
        f"{seen(statuses)}; proxy {'alive' if alive else 'DEAD'}, "
        f"{'CRITICAL logged' if critical else 'nothing logged'}, exit {status} after SIGTERM "
        f"({EXIT_UNSAFE} = stopped touching the map)",
        f"{kept} stored after the restart replayed the spill",
        str(statuses[200] - kept),
        rss_cell(rss_before, rss_after, peak),
    )


async def paced(url: str, rate: float, stop_event: asyncio.Event) -> Counter[int | str]:
    """Open-loop load: one request every 1/rate s until `stop_event`."""
    statuses: Counter[int | str] = Counter()
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks: set[asyncio.Task[None]] = set()

        async def one() -> None:
            statuses[await post(session, url)] += 1

        next_at = loop.time()
        while not stop_event.is_set():
            task = asyncio.create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            next_at += 1.0 / rate
            await asyncio.sleep(max(0.0, next_at - loop.time()))
        await asyncio.gather(*tasks)
    return statuses


@contextlib.contextmanager
def sqlite_outage(db: Path) -> Iterator[None]:
    """Another process holds the database: every write waits its lock timeout, then fails."""
    blocker = sqlite3.connect(db, isolation_level=None, timeout=30)
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()


async def outage_then_sigkill(
    procs: Procs, up: FaultUpstream, work: Path, backend: str, kill_after_s: float
) -> Row:
    """Paced load (50 requests/s, default store settings); the store goes down 3 s in; SIGKILL
    `kill_after_s` later; the store comes back; a second serve replays the spill."""
    rate = 50.0
    cluster: PgCluster | None = None
    if backend.startswith("postgresql"):
        initdb = find_pg_bin("initdb")
        if initdb is None:
            return Row(f"PostgreSQL outage + SIGKILL after {kill_after_s:g} s", "skipped: no "
                       "PostgreSQL", "-", "-", "-")  # fmt: skip
        cluster = PgCluster(initdb)
        cluster.start()
        store_url = cluster.url
    else:
        store_url = f"sqlite:///{work}/store.db"
    try:
        toml = store_toml(up, work, store=store_url)
        first = procs.serve(work, toml)
        await first.ready()
        rss_before = proc_mem(first.pid)[0]
        stop_event = asyncio.Event()
        load = asyncio.create_task(paced(first.url, rate, stop_event))
        await asyncio.sleep(3.0)
        blocker: contextlib.AbstractContextManager[None]
        if backend == "postgresql-frozen":
            assert cluster is not None
            blocker = frozen(cluster)  # a hung server: writes wait, nothing is refused
        elif cluster is not None:
            await asyncio.to_thread(cluster.stop)  # connections refused from now on
            blocker = contextlib.nullcontext()
        else:
            blocker = sqlite_outage(work / "store.db")
        with blocker:
            outage_at = time.monotonic()
            await asyncio.sleep(kill_after_s)
            spilled = await first.metric("specproxy_store_spilled_total")
            rss_after, peak = proc_mem(first.pid)
            os.kill(first.pid, signal.SIGKILL)
            into_outage = time.monotonic() - outage_at
            stop_event.set()
            statuses = await load
            await first.wait(30)
        if backend == "postgresql":
            assert cluster is not None
            await asyncio.to_thread(cluster.start)
        second = procs.serve(work, toml)  # the same spill path: it replays the dead one's file
        await second.ready()

        async def replayed() -> bool:
            return await second.metric("specproxy_store_pending") == 0

        await until(replayed, 120)
        await asyncio.sleep(2.0)  # the last batch committed
        await stop(second)
        kept = await count_rows(backend, work, store_url)
    finally:
        if cluster is not None:
            cluster.close()
    answered = statuses[200]
    lost = answered - kept
    name = {
        "sqlite": "SQLite (locked; writes wait the 5 s lock timeout)",
        "postgresql": "PostgreSQL (stopped; writes refused)",
        "postgresql-frozen": "PostgreSQL (SIGSTOPped; writes hang, 30 s command timeout)",
    }[backend]
    return Row(
        f"{name} outage, SIGKILL {into_outage:.0f} s into it (50 req/s)",
        f"{seen(statuses)}; {spilled:.0f} rows spilled before the kill",
        f"{kept} stored after the restart replayed the spill",
        f"{lost} = {lost / rate:.1f} s of traffic",
        rss_cell(rss_before, rss_after, peak),
    )


@contextlib.contextmanager
def frozen(cluster: PgCluster) -> Iterator[None]:
    """Every process of the cluster stopped (SIGSTOP), then continued: a hung database."""
    postmaster = int((cluster.data / "postmaster.pid").read_text().split()[0])
    pids = [postmaster, *children(postmaster)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


async def count_rows(backend: str, work: Path, url: str) -> int:
    if backend == "sqlite":
        return len({r[0] for r in stored_rows(work / "store.db", RUN)})
    import asyncpg  # the postgres extra's driver

    conn = await asyncpg.connect(url)
    try:
        value = await conn.fetchval(
            "SELECT count(DISTINCT request_id) FROM requests WHERE run_id = $1", RUN
        )
        return int(value)
    finally:
        await conn.close()


async def blackholed(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    with blackholed_url() as dead:
        toml = f"""
baseline_url = "{up.url}"
speculative_url = "{dead}"
run_id = "{RUN}"
[routing]
speculative_share = 1.0
[timeouts.speculative]
connect_s = 1.0
[store]
url = "sqlite:///{work}/store.db"
"""
        serve = procs.serve(work, toml)
        await serve.ready()
        rss_before = proc_mem(serve.pid)[0]
        statuses: Counter[int | str] = Counter()
        took = []
        async with aiohttp.ClientSession() as session:
            for _ in range(30):
                started = time.monotonic()
                statuses[await post(session, serve.url)] += 1
                took.append(time.monotonic() - started)
        ejected = await serve.metric('specproxy_endpoint_events_total{arm="speculative",event="ej')
        logged = "ejected" in serve.log.read_text()
        rss_after, peak = proc_mem(serve.pid)
        await stop(serve)
    rows = query(work / "store.db", "SELECT arm, rerouted_from, reroute_reason FROM requests")
    slow = sum(t >= 0.9 for t in took)
    return Row(
        "black-holed treatment endpoint (SYNs dropped; its connect_s 1 s), 30 requests",
        f"{seen(statuses)}; {slow} waited its connect_s (~{max(took):.1f} s) before failing "
        f"over, then p50 {statistics.median(took[slow:]) * 1000:.0f} ms; ejection "
        f"{'logged' if logged else 'NOT logged'}, "
        f"specproxy_endpoint_events_total ejected {ejected:.0f}",
        ", ".join(
            f"{n} x {arm} (rerouted from {src}: {why})"
            for (arm, src, why), n in Counter(rows).items()
        ),
        str(statuses[200] - len(rows)),
        rss_cell(rss_before, rss_after, peak),
    )


async def future_rows(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    """600 rows stamped 3 h ahead (a clock stepped back, a fast replica) beside 600 normal
    ones, read by serve's stats process; /api/stats says what the windows hold."""
    from tests.stats.job.runs import RUN as STATS_RUN
    from tests.stats.job.runs import records

    db = work / "store.db"
    store = SqliteStore(StoreConfig(url=f"sqlite:///{db}"), run_id=STATS_RUN)
    await store.start()
    now = time.time()
    normal = records(600, now - 100.0, 1.5, 0)
    ahead = [
        dataclasses.replace(r, request_id=f"fast-{r.request_id}")
        for r in records(600, now + 3 * 3600.0, 1.5, 1)
    ]
    for rec in (*normal, *ahead):
        store.record(rec)
    await store.flush()
    await store.close()
    toml = f"""
baseline_url = "{up.url}"
speculative_url = "{up.url}"
run_id = "{STATS_RUN}"
[store]
url = "sqlite:///{db}"
[stats]
interval_s = 0.5
resamples = 200
windows_s = [300, 3600, "all"]
[warmup]
requests = 5
"""
    serve = procs.serve(work, toml)
    await serve.ready()
    rss_before = proc_mem(serve.pid)[0]
    result: dict[str, Any] = {}

    async def got() -> bool:
        async with (
            aiohttp.ClientSession() as session,
            session.get(serve.url + "/api/stats") as resp,
        ):
            if resp.status != 200:
                return False
            result.update(await resp.json())
            return True

    await until(got, 180)
    rss_after, peak = proc_mem(serve.pid)
    await stop(serve)
    if not result:
        return Row("rows stamped 3 h ahead", "no /api/stats result", "-", "-", "-")
    windows = result["results"]["all"]
    held = {
        label: sum(w["samples"].values()) + sum(w["excluded_warmup"].values())
        for label, w in windows.items()
    }
    return Row(
        "600 rows stamped 3 h ahead beside 600 normal ones (one store, serve's stats process)",
        f"/api/stats: lag_s {result['lag_s']:.0f}, future_rows {result['future_rows']}, "
        f"window_end - computed_at {result['window_end'] - result['computed_at']:.1f} s",
        "rows in each window: " + ", ".join(f"{k} {v}" for k, v in held.items()),
        "0 (the 600 are counted as future_rows, in no window)",
        rss_cell(rss_before, rss_after, peak),
    )


async def big_metrics(procs: Procs, up: FaultUpstream, work: Path, page_bytes: int | None) -> Row:
    """4 closed-loop clients for 20 s while the speculative engine's /metrics page is
    `page_bytes` (None: a real page, ~3 kB), scraped every 5 s (the default)."""
    async with (
        FaultUpstream() as base,
        FaultUpstream(
            metrics=padded_metrics_page(page_bytes) if page_bytes else FaultUpstream().metrics
        ) as spec,
    ):
        toml = store_toml(base, work).replace(
            f'speculative_url = "{base.url}"', f'speculative_url = "{spec.url}"'
        )
        serve = procs.serve(work, toml)
        await serve.ready()
        await asyncio.sleep(6.0)  # a first round of scrapes
        rss_before = proc_mem(serve.pid)[0]
        cpu0, t0 = cpu_s(serve.pid), time.monotonic()
        took: list[float] = []
        statuses: Counter[int | str] = Counter()
        end = t0 + 20.0

        async def client() -> None:
            async with aiohttp.ClientSession() as session:
                while time.monotonic() < end:
                    started = time.monotonic()
                    statuses[await post(session, serve.url)] += 1
                    took.append(time.monotonic() - started)

        await asyncio.gather(*(client() for _ in range(4)))
        share = (cpu_s(serve.pid) - cpu0) / (time.monotonic() - t0)
        rss_after, peak = proc_mem(serve.pid)
        log = serve.log.read_text()
        await stop(serve)
    kept = len(stored_rows(work / "store.db", RUN))
    took.sort()
    p50, p99 = took[len(took) // 2], took[int(len(took) * 0.99)]
    size = "a real page (3 kB)" if page_bytes is None else f"a {page_bytes / 1e6:.1f} MB page"
    stretch = re.search(r"took ([0-9.]+) s of CPU: scraping every ([0-9.]+) s", log)
    stretched = (
        f"a parse took {stretch[1]} s of CPU: scraped every {stretch[2]} s" if stretch else ""
    )
    refused = "refused (over 4 MiB)" if "exceeds" in log else ""
    return Row(
        f"engine /metrics: {size}, scraped every 5 s; 4 clients for 20 s",
        f"{seen(statuses)}; p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms; proxy CPU "
        f"{share:.0%} of a core{'; ' if stretched or refused else ''}{stretched or refused}",
        f"{kept} stored",
        str(statuses[200] - kept),
        rss_cell(rss_before, rss_after, peak),
    )


async def config_mistake(work: Path, name: str, toml: str, env: dict[str, str]) -> Row:
    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    status, stderr = await refusal(work, toml, env)
    if status is None:
        return Row(f"config: {name}", "serve RAN with the mistake", "-", "-", "-")
    lines = [line for line in stderr.splitlines() if line.strip()]
    traceback = any("Traceback" in line for line in lines)
    made = await asyncio.to_thread(lambda: list(work.glob("*.db")))
    return Row(
        f"config: {name}",
        f"serve exits {status}{' WITH A TRACEBACK' if traceback else ''}: "
        f"`{lines[-1] if lines else ''}`",
        "A STORE WAS MADE" if made else "none (nothing started)",
        "-",
        "-",
    )


async def config_cases(procs: Procs, up: FaultUpstream, work: Path) -> list[Row]:
    arms = f'baseline_url = "{up.url}"\nspeculative_url = "{up.url}"\n'
    return [
        await config_mistake(work / "port", "`port = 8000.5`", f"port = 8000.5\n{arms}", {}),
        await config_mistake(
            work / "window",
            '`windows_s = ["x"]`',
            f'port = {{port}}\n{arms}[stats]\nwindows_s = ["x"]\n',
            {},
        ),
        await config_mistake(
            work / "env",
            "`SPECPROXY_STORE_URL` (one underscore)",
            f"port = {{port}}\n{arms}",
            {"SPECPROXY_STORE_URL": "sqlite:///shared.db"},
        ),
    ]


async def raw(port: int, head: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    data = await asyncio.wait_for(reader.read(), 60)
    writer.close()
    status_line, _, rest = data.partition(b"\r\n")
    head_raw, _, body = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in head_raw.decode("latin-1").split("\r\n"):
        key, _, value = line.partition(":")
        headers[key.strip().lower()] = value.strip()
    return int(status_line.split()[1]), headers, body


async def long_header_lines(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    serve = procs.serve(work, store_toml(up, work))
    await serve.ready()
    rss_before = proc_mem(serve.pid)[0]
    body = json.dumps(chat()).encode()
    answers = []
    forwarded = 0
    for size in (8_300, 40_000, MAX_HEADER_BYTES + 100, 130 * 1024):
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Authorization: Bearer {'j' * size}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode() + body
        status, headers, _ = await raw(serve.port, head)
        forwarded += status == 200
        kind = "JSON" if headers.get("content-type", "").startswith("application/json") else "text"
        rid = "request id" if headers.get(REQUEST_ID_HEADER) else "no request id"
        answers.append(f"{size / 1000:.1f} kB: {status} {kind}, {rid}")
    url_status, _, _ = await raw(
        serve.port, f"GET /v1/models?q={'u' * 20_000} HTTP/1.1\r\nHost: x\r\n"
        "Connection: close\r\n\r\n".encode(),
    )  # fmt: skip
    answers.append(f"20 kB request line: {url_status}")
    rss_after, peak = proc_mem(serve.pid)
    await stop(serve)
    kept = len(stored_rows(work / "store.db", RUN))
    return Row(
        "one long header line (Authorization) of 8.3 kB / 40 kB / 64 KiB+100 / 130 KiB",
        "; ".join(answers),
        f"{kept} stored (the forwarded ones)",
        str(forwarded - kept),
        rss_cell(rss_before, rss_after, peak),
    )


async def dns_subsets(procs: Procs, up: FaultUpstream, work: Path) -> Row:
    """130 addresses behind one name, one live engine (127.0.0.99, last in string order);
    8 replicas, each with its own host name (rendezvous seed) and a private /etc/hosts."""
    replicas, addresses = 8, 130
    check = await asyncio.create_subprocess_exec(
        "unshare", "-Urmu", "true", stderr=asyncio.subprocess.DEVNULL
    )
    if await check.wait() != 0:
        return Row("DNS: 130 addresses", "skipped: unshare not permitted", "-", "-", "-")
    await asyncio.to_thread(work.mkdir, parents=True, exist_ok=True)
    hosts = work / "hosts"
    hosts.write_text(
        "127.0.0.1 localhost\n"
        + "".join(f"127.0.0.{i} engines.test\n" for i in range(1, addresses + 1))
    )
    reached, answers, kept_live = 0, Counter[int | str](), 0
    rss_b, rss_a = [], []
    async with FaultUpstream(host="127.0.0.99") as live:
        port = int(live.url.rsplit(":", 1)[1])
        for replica in range(replicas):
            rdir = work / f"replica-{replica}"
            rdir.mkdir()
            toml = f"""
baseline_url = "{up.url}"
run_id = "{RUN}"
[speculative]
dns = "engines.test"
port = {port}
on_down = "error"
[routing]
speculative_share = 1.0
[store]
url = "sqlite:///{rdir}/store.db"
"""
            wrap = [
                "unshare", "-Urmu", "sh", "-c",
                'mount --bind "$0" /etc/hosts && hostname "$1" && shift && exec "$@"',
                str(hosts), f"specproxy-{replica}",
            ]  # fmt: skip
            serve = procs.serve(rdir, toml, wrap=wrap)
            await serve.ready()
            rss_b.append(proc_mem(serve.pid)[0])
            statuses: Counter[int | str] = Counter()
            async with aiohttp.ClientSession() as session:
                for _ in range(5):
                    statuses[await post(session, serve.url)] += 1
            rss_a.append(proc_mem(serve.pid)[0])
            await stop(serve)
            answers.update(statuses)
            live_rows = query(
                rdir / "store.db", "SELECT count(*) FROM requests WHERE engine_url = ?", live.url
            )[0][0]
            kept_live += live_rows
            reached += statuses[200] > 0
    return Row(
        f"DNS: {addresses} addresses, 1 live (last in string order), {replicas} replicas "
        "(5 requests each, on_down = error)",
        f"{reached} of {replicas} replicas reach the live engine; {seen(answers)}",
        f"{kept_live} stored as served by the live engine",
        "0",
        f"{mib(int(statistics.mean(rss_b)))} → {mib(int(statistics.mean(rss_a)))} MiB "
        "(mean of the replicas)",
    )


# ------------------------------------------------------------------------------ the table


async def main(only: set[str], case_timeout_s: float) -> None:
    procs = Procs()
    rows: list[tuple[str, Row]] = []
    root = Path(tempfile.mkdtemp(prefix="specproxy-faults-"))

    async with FaultUpstream() as up:

        async def case(number: str, name: str, make: Case, *args: Any) -> None:
            if only and name not in only:
                return
            print(f"... {number} {name}", file=sys.stderr, flush=True)
            try:
                got = await asyncio.wait_for(make(procs, up, root / name, *args), case_timeout_s)
            except Exception as exc:  # the row says what went wrong; the table goes on
                got = Row(name, f"ERROR: {type(exc).__name__}: {exc}"[:300], "-", "-", "-")
            finally:
                procs.kill_all()
            for row in got if isinstance(got, list) else [got]:
                rows.append((number, row))

        await case("1", "workers", sigkill_worker, 2)
        await case("2", "protect_metrics", protected_metrics)
        await case("3", "slow_readers", slow_readers)
        await case("4", "huge_event", huge_event, True)
        await case("4", "huge_event_passthrough", huge_event, False)
        await case("5", "shm", shm_truncated)
        for backend, after in (
            ("sqlite", 3.0),
            ("sqlite", 30.0),
            ("postgresql", 30.0),
            ("postgresql-frozen", 10.0),
        ):
            await case("6", f"outage_{backend}_{after:g}", outage_then_sigkill, backend, after)
        await case("7", "blackhole", blackholed)
        await case("8", "future", future_rows)
        for size in (None, 3_900_000, 13_600_000):
            await case("9", f"metrics_{size}", big_metrics, size)
        await case("10", "config", config_cases)
        await case("11", "headers", long_header_lines)
        await case("12", "dns", dns_subsets)
        for index in (0, 1):
            await case("+", f"worker_{index}", sigkill_worker, index)
    await asyncio.to_thread(shutil.rmtree, root, True)
    print(
        f"\nfault table ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the end)\n"
    )
    print("| # | case | what the client saw | records kept | lost | proxy RSS before → after |")
    print("| --- | --- | --- | --- | --- | --- |")
    for number, row in rows:
        cells = [number, row.case, row.client, row.records, row.lost, row.rss]
        print("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=[], help="case names (see main)")
    parser.add_argument("--case-timeout", type=float, default=300.0)
    args = parser.parse_args()
    asyncio.run(main(set(args.only), args.case_timeout))
