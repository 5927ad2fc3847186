"""What the statistics cost the relay: the proxy's added latency while its stats process computes
back to back over a 30-day store, against the same proxy with no statistics computed.

Setup, all on loopback, each in its own process:
  * a SQLite store as the stats leader's compaction leaves a 30-day run at 1k req/s per arm
    (`bench_rollups._build`: hour, minute and fine rollup tiers and the moment rows; its run id
    and arms), ending at the current minute, so every window of a tick has data;
  * a fast upstream (`upstream` below: aiohttp on port 0) answering /v1/chat/completions,
    non-streaming and streaming, after a fixed `--delay-ms`;
  * `specproxy serve` on that store, run id and model of the built run, either with
    `[stats] compute = "child"` and `stats.interval_s = --stats-interval` (its one stats
    process computes, stores and compacts, tick after tick) or with `compute = "external"` and no
    stats process anywhere (the proxy only polls the history, which nothing writes);
  * an open-loop load generator (`load` below): requests at fixed times `i / --rate` over
    `--concurrency` connections, half of them streaming, each timed from its scheduled start
    (so a stall shows as latency, not as fewer requests) to the end of its body.
Phases A/B/B/A: statistics on, off, off, on, `--seconds` each after `--warmup` seconds that are
not counted, a fresh proxy per phase; an on-phase starts its load once the stats process has
stored its first (cold) result. Printed per phase: the ADDED latency, p50/p99/p99.9 in ms, i.e.
client-observed latency minus the upstream's fixed delay (so it also holds the load generator's
and the upstream's own time: the `direct` line, the same load straight to the upstream in the
same run, is that floor); requests/s achieved; errors; how late the generator sent (p99); and
for an on-phase how many results the stats process stored during the measured load and their
median compute time (`duration_s`), which proves the ticks ran.

`--taskset PROXY[:UPSTREAM[:LOAD[:STATS]]]` pins each to a CPU list (e.g. `0-1:2-3:4-7`). Without
STATS the stats process is serve's child and inherits the proxy's CPUs: they compete for the same
cores, as on one small machine. With STATS (e.g. `0-1:2-3:4-7:8-9`) an on-phase runs the proxy
with `compute = "external"` and `specproxy stats --follow` on the same config pinned to STATS:
the Kubernetes layout, where the stats Deployment's pod has cores of its own. Needs
aiohttp, numpy, scipy, prometheus-client (uvloop if installed); no network, no PostgreSQL.

    python3 benchmarks/bench_isolation.py --days 30 --rate 500 --seconds 60 --taskset 0-1:2-3:4-7
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import aiohttp
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
RUN = "bench"  # bench_rollups' run (its store builder writes this run id, model "m", both arms)
MODEL = "m"
EVENTS = 8  # SSE events of a streamed answer
_T = TypeVar("_T")


# ---- the upstream --------------------------------------------------------------------------


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def upstream_app(delay_s: float) -> web.Application:
    """OpenAI-compatible enough for the proxy: chat completions after `delay_s`, models,
    health, a minimal /metrics."""
    usage = {"prompt_tokens": 10, "completion_tokens": EVENTS, "total_tokens": 10 + EVENTS}

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        await asyncio.sleep(delay_s)
        if not body.get("stream"):
            message = {"role": "assistant", "content": "x" * EVENTS}
            choice = {"index": 0, "message": message, "finish_reason": "length"}
            return web.json_response({"choices": [choice], "usage": usage, "model": MODEL})
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        chunks = [_sse({"choices": [{"index": 0, "delta": {"content": "x"}}]})] * EVENTS
        if body.get("stream_options", {}).get("include_usage"):
            chunks.append(_sse({"choices": [], "usage": usage}))
        await resp.write(b"".join([*chunks, b"data: [DONE]\n\n"]))
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL}]})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def metrics(request: web.Request) -> web.Response:
        gauge = "vllm:num_requests_running"
        text = f'# TYPE {gauge} gauge\n{gauge}{{model_name="{MODEL}"}} 0\n'
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app


async def run_upstream(delay_s: float) -> None:
    runner = web.AppRunner(upstream_app(delay_s), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await runner.cleanup()


# ---- the load ------------------------------------------------------------------------------


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The `q` quantile (0..1) of sorted values, nearest rank."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


async def run_load(
    url: str, rate: float, seconds: float, warmup: float, concurrency: int
) -> dict[str, Any]:
    """Open loop: request i at t0 + i / rate; its latency counts from that time."""
    total = int((warmup + seconds) * rate)
    timings: list[tuple[float, float, float, bool]] = []  # scheduled, sent, done, ok
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": EVENTS}
    connector = aiohttp.TCPConnector(limit=concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(i: int, scheduled: float) -> None:
            sent = time.perf_counter()
            ok = False
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.post(url, json={**body, "stream": i % 2 == 0}) as resp:
                    await resp.read()
                    ok = resp.status == 200
            timings.append((scheduled, sent, time.perf_counter(), ok))

        tasks: list[asyncio.Task[None]] = []
        t0 = time.perf_counter() + 0.2
        for i in range(total):
            scheduled = t0 + i / rate
            delay = scheduled - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, scheduled)))
        await asyncio.gather(*tasks)
    counted = [t for t in timings if t[0] >= t0 + warmup]
    latency = sorted(done - scheduled for scheduled, _, done, ok in counted if ok)
    late = sorted(sent - scheduled for scheduled, sent, _, _ in counted)
    span = max(t[2] for t in counted) - min(t[0] for t in counted) if counted else math.nan
    return {
        "n": len(counted),
        "errors": sum(1 for t in counted if not t[3]),
        "rps": len(latency) / span if span else math.nan,
        "p50": percentile(latency, 0.50),
        "p99": percentile(latency, 0.99),
        "p999": percentile(latency, 0.999),
        "late_p99": percentile(late, 0.99),
    }


# ---- the proxy and its store ---------------------------------------------------------------


def cpu_list(text: str) -> set[int]:
    """A taskset CPU list: `0-3,6` -> {0, 1, 2, 3, 6}."""
    cpus: set[int] = set()
    for part in filter(None, text.split(",")):
        lo, _, hi = part.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return cpus


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def spawn(argv: list[str], cpus: set[int] | None, **kwargs: Any) -> subprocess.Popen[str]:
    """Start `argv` (this Python), pinned to `cpus` before it does anything heavy."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}
    proc = subprocess.Popen([sys.executable, *argv], env=env, text=True, **kwargs)
    if cpus:
        os.sched_setaffinity(proc.pid, cpus)
    return proc


def history(db: Path) -> list[tuple[float, float]]:
    """(t, duration_s) of every stored stats result of the run."""
    with sqlite3.connect(db, timeout=60) as conn:
        rows = conn.execute(
            "SELECT t, json_extract(result, '$.duration_s') FROM stats_history WHERE run_id = ?",
            (RUN,),
        ).fetchall()
    return [(float(t), float(d or 0.0)) for t, d in rows]


@dataclass(frozen=True, slots=True)
class Bench:
    work: Path
    db: Path
    upstream: str
    args: argparse.Namespace
    proxy_cpus: set[int] | None
    load_cpus: set[int] | None
    stats_cpus: set[int] | None

    def load(self, url: str) -> dict[str, Any]:
        a = self.args
        argv = [__file__, "load", "--url", url, "--rate", str(a.rate), "--seconds", str(a.seconds)]
        argv += ["--warmup", str(a.warmup), "--concurrency", str(a.concurrency)]
        proc = spawn(argv, self.load_cpus, stdout=subprocess.PIPE)
        out, _ = proc.communicate(timeout=a.seconds + a.warmup + 300)
        if proc.returncode != 0:
            raise RuntimeError(f"load generator failed ({proc.returncode})")
        result: dict[str, Any] = json.loads(out.splitlines()[-1])
        return result

    def start_proxy(self, stats: bool) -> tuple[list[subprocess.Popen[str]], IO[str], str]:
        """`specproxy serve` on the store: its stats process computing (serve's child, or a
        process of its own on `stats_cpus`), or none at all."""
        port = free_port()
        child = stats and self.stats_cpus is None
        config = self.work / f"proxy-{port}.toml"
        config.write_text(
            f'baseline_url = "{self.upstream}"\nspeculative_url = "{self.upstream}"\n'
            f'port = {port}\nrun_id = "{RUN}"\n'
            f'[store]\nurl = "sqlite:///{self.db}"\nspill_path = "{self.work}/spill.jsonl"\n'
            f"[stats]\ninterval_s = {self.args.stats_interval}\n"
            f'compute = "{"child" if child else "external"}"\n'
        )
        log = open(self.work / f"proxy-{port}.log", "w")  # noqa: SIM115 - closed by the caller
        argv = ["-m", "specproxy", "serve", "--config", str(config)]
        procs = [spawn(argv, self.proxy_cpus, cwd=self.work, stdout=subprocess.DEVNULL, stderr=log)]
        if stats and not child:
            follow = ["-m", "specproxy", "stats", "--follow", "--config", str(config)]
            procs.append(
                spawn(follow, self.stats_cpus, cwd=self.work, stdout=subprocess.DEVNULL, stderr=log)
            )
        return procs, log, f"http://127.0.0.1:{port}"

    @contextlib.asynccontextmanager
    async def proxy(self, stats: bool) -> AsyncIterator[str]:
        procs, log, url = self.start_proxy(stats)
        try:
            await wait_ready(url + "/readyz", procs[0])
            yield url
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                try:
                    await asyncio.to_thread(proc.wait, 120)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            log.close()


async def wait_ready(url: str, proc: subprocess.Popen[str], deadline_s: float = 300) -> None:
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            if proc.poll() is not None:
                raise RuntimeError(f"the proxy exited ({proc.returncode})")
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


async def first_result(db: Path, before: int, deadline_s: float = 600) -> None:
    """Until the stats process stored a result (its first, cold tick is done)."""
    end = time.monotonic() + deadline_s
    while len(history(db)) <= before:
        if time.monotonic() > end:
            raise RuntimeError("the stats process stored no result")
        await asyncio.sleep(0.5)


def line(label: str, r: dict[str, Any], extra: str = "") -> str:
    ms = {k: 1000 * r[k] for k in ("p50", "p99", "p999", "late_p99")}
    return (
        f"{label:<10} added p50 {ms['p50']:7.2f} ms  p99 {ms['p99']:7.2f} ms  "
        f"p99.9 {ms['p999']:7.2f} ms  {r['rps']:7.1f} req/s  errors {r['errors']}  "
        f"sent late p99 {ms['late_p99']:.2f} ms{extra}"
    )


def added(r: dict[str, Any], delay_s: float) -> dict[str, Any]:
    return {**r, **{k: r[k] - delay_s for k in ("p50", "p99", "p999")}}


async def run_bench(args: argparse.Namespace) -> None:
    sys.path[:0] = [str(REPO / "src"), str(REPO)]  # a clone works without installing it
    from benchmarks import bench_rollups
    from specproxy.config import StoreConfig
    from specproxy.store.factory import open_store

    assert bench_rollups.RUN == RUN

    sets = [cpu_list(p) if p else None for p in (args.taskset or "").split(":")] + [None] * 4
    proxy_cpus, upstream_cpus, load_cpus, stats_cpus = sets[0], sets[1], sets[2], sets[3]
    work = Path(tempfile.mkdtemp(prefix="bench-isolation-"))
    db = work / "store.db"
    url = f"sqlite:///{db}"
    setup = open_store(StoreConfig(url=url, spill_path=str(work / "s0.jsonl")), run_id=RUN)
    await setup.start()  # the schema
    await setup.close()
    built = time.perf_counter()
    await bench_rollups.build_rollups(url, args.days, args.rate_per_arm, int(time.time() // 60))
    print(f"store built in {time.perf_counter() - built:.0f} s", flush=True)
    delay_s = args.delay_ms / 1000
    upstream = spawn([__file__, "upstream", "--delay-ms", str(args.delay_ms)], upstream_cpus,
                     stdout=subprocess.PIPE)  # fmt: skip
    try:
        assert upstream.stdout is not None
        port = int(upstream.stdout.readline().split()[1])
        base = f"http://127.0.0.1:{port}"
        bench = Bench(work, db, base, args, proxy_cpus, load_cpus, stats_cpus)
        where = (
            "serve's child"
            if stats_cpus is None
            else f"its own, on CPUs {args.taskset.split(':')[3]}"
        )
        print(
            f"added latency = client-observed - the upstream's fixed {args.delay_ms:g} ms; "
            f"open loop {args.rate:g} req/s over {args.concurrency} connections, half "
            f"streaming; {args.seconds:g} s per phase after {args.warmup:g} s of warm-up; "
            f"stats.interval_s {args.stats_interval:g}; pinned {args.taskset or 'nowhere'}; "
            f"stats process: {where}",
            flush=True,
        )
        direct = await asyncio.to_thread(bench.load, base + "/v1/chat/completions")
        print(line("direct", added(direct, delay_s), "  (no proxy: the floor)"), flush=True)
        for label, stats in (("A on", True), ("B off", False), ("B off", False), ("A on", True)):
            async with bench.proxy(stats) as proxy:
                before = len(history(db))
                if stats:
                    await first_result(db, before)
                start = len(history(db))
                result = await asyncio.to_thread(bench.load, proxy + "/v1/chat/completions")
                ticks = history(db)[start:]
            durations = sorted(d for _, d in ticks)
            extra = f"  ticks stored {len(ticks)}"
            if durations:
                extra += f" (median compute {durations[len(durations) // 2]:.2f} s)"
            print(line(label, added(result, delay_s), extra), flush=True)
    finally:
        upstream.send_signal(signal.SIGTERM)
        upstream.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = parser.add_subparsers(dest="mode")
    up = sub.add_parser("upstream", help="(internal) the fast upstream; prints its port")
    up.add_argument("--delay-ms", type=float, default=5.0)
    ld = sub.add_parser("load", help="(internal) one phase of load; prints a JSON summary")
    ld.add_argument("--url", required=True)
    for p in (parser, ld):
        p.add_argument("--rate", type=float, default=500.0, help="requests/s, open loop")
        p.add_argument("--seconds", type=float, default=60.0, help="measured seconds per phase")
        p.add_argument("--warmup", type=float, default=5.0, help="uncounted seconds per phase")
        p.add_argument("--concurrency", type=int, default=64, help="client connections")
    parser.add_argument("--days", type=float, default=30.0, help="days of rollups in the store")
    parser.add_argument("--rate-per-arm", type=float, default=1000.0, help="the store's req/s")
    parser.add_argument("--delay-ms", type=float, default=5.0, help="the upstream's fixed delay")
    parser.add_argument("--stats-interval", type=float, default=0.25, help="stats.interval_s")
    parser.add_argument("--taskset", metavar="PROXY[:UPSTREAM[:LOAD[:STATS]]]", help="CPU lists")
    args = parser.parse_args()
    if args.mode == "upstream":
        _run(run_upstream(args.delay_ms / 1000))
    elif args.mode == "load":
        report = _run(run_load(args.url, args.rate, args.seconds, args.warmup, args.concurrency))
        print(json.dumps(report))
    else:
        asyncio.run(run_bench(args))


def _run(main: Coroutine[Any, Any, _T]) -> _T:
    """On uvloop where installed (the upstream and the load generator stay cheap)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    result: _T = uvloop.run(main)
    return result


if __name__ == "__main__":
    main()
