"""Proxy overhead and throughput, beside a bare aiohttp pass-through measured in the same run.

Processes (each its own interpreter, uvloop everywhere):
  upstream  a raw-asyncio HTTP/1.1 server answering every POST with the real vLLM non-streaming
            body (`chat_nonstream_spec.json`): as cheap as possible, so it is not the bottleneck;
  bare      the few-line aiohttp pass-through (one ClientSession, read body, post, return);
  proxy     specproxy's app (routing, JSON body parse, usage parse, record, Prometheus);
  loadgen   this process: a raw-asyncio keep-alive client (no HTTP library on the hot path).

Added latency: sequential keep-alive requests, interleaved direct / bare / proxy round by round
so that drift and noise hit all three alike; added = percentile(target) - percentile(direct).
Throughput: closed loop, `--connections` keep-alive connections for `--seconds` per target.
With `--pin`, processes are pinned to CPUs (upstream, target, loadgen on different cores).

    .venv/bin/python benchmarks/bench_proxy.py [--rounds 3000] [--seconds 5] [--connections 64]
        [--trials 3] [--pin 2,4,6,8]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BODY = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/vllm-0.32.0-cpu/chat_nonstream_spec.json"
)
REQUEST_BODY = b'{"model":"tiny-llama","messages":[{"role":"user","content":"Hello there"}]}'
PATH = "/v1/chat/completions"


# --------------------------------------------------------------------------- roles


def run_upstream(port: int) -> None:
    body = BODY.read_bytes()
    response = (
        b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )

    class Upstream(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport: Any = transport
            self.buf = b""

        def data_received(self, data: bytes) -> None:
            self.buf += data
            while True:
                head_end = self.buf.find(b"\r\n\r\n")
                if head_end < 0:
                    return
                head = self.buf[:head_end].lower()
                at = head.find(b"content-length:")
                line_end = head.find(b"\r\n", at)
                stop = line_end if line_end > 0 else len(head)
                length = int(head[at + 15 : stop]) if at >= 0 else 0
                end = head_end + 4 + length
                if len(self.buf) < end:
                    return
                self.buf = self.buf[end:]
                self.transport.write(response)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Upstream, "127.0.0.1", port, backlog=4096)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    _run(main())


def run_bare(port: int, upstream: str) -> None:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    async def main() -> None:
        session = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None))

        async def handle(request: web.Request) -> web.Response:
            body = await request.read()
            async with session.post(
                upstream + request.path, data=body, headers=request.headers
            ) as r:
                payload = await r.read()
                return web.Response(body=payload, status=r.status, content_type=r.content_type)

        app = web.Application()
        app.router.add_post(PATH, handle)
        await _serve(app, port)

    _run(main())


def run_proxy(port: int, upstream: str, ring: int | None) -> None:
    from specproxy.app import create_app
    from specproxy.config import Config
    from specproxy.proxy.recorder import MemoryRecorder

    async def main() -> None:
        cfg = Config(baseline_url=upstream, speculative_url=upstream)
        recorder = MemoryRecorder(ring) if ring is not None else None
        await _serve(create_app(cfg, recorder=recorder), port)

    _run(main())


async def _serve(app: Any, port: int) -> None:
    from aiohttp import web

    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    server = site._server
    assert server is not None
    print(server.sockets[0].getsockname()[1], flush=True)  # type: ignore[attr-defined]
    await asyncio.Event().wait()


def _run(main: Any) -> None:
    import uvloop

    uvloop.run(main)


# --------------------------------------------------------------------------- load generator


class Client(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection; `request()` sends one POST and awaits the reply."""

    def __init__(self, request: bytes) -> None:
        self.raw = request
        self.buf = b""
        self.waiter: asyncio.Future[int] | None = None
        self.transport: Any = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buf += data
        head_end = self.buf.find(b"\r\n\r\n")
        if head_end < 0:
            return
        head = self.buf[:head_end].lower()
        at = head.find(b"content-length:")
        if at < 0:
            raise RuntimeError("benchmark expects content-length responses")
        line_end = head.find(b"\r\n", at)
        length = int(head[at + 15 : line_end if line_end > 0 else len(head)].strip())
        if len(self.buf) >= head_end + 4 + length and self.waiter is not None:
            status = int(self.buf[9:12])
            self.buf = self.buf[head_end + 4 + length :]
            self.waiter.set_result(status)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(ConnectionError("connection lost"))

    async def request(self) -> int:
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(self.raw)
        return await self.waiter


async def connect(port: int) -> Client:
    raw = (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer sk-bench\r\nContent-Length: {len(REQUEST_BODY)}\r\n\r\n"
    ).encode() + REQUEST_BODY
    loop = asyncio.get_running_loop()
    _, client = await loop.create_connection(lambda: Client(raw), "127.0.0.1", port)
    return client


async def latency(ports: dict[str, int], rounds: int) -> dict[str, list[float]]:
    clients = {name: await connect(port) for name, port in ports.items()}
    samples: dict[str, list[float]] = {name: [] for name in ports}
    names = list(ports)
    for i in range(rounds + 200):
        order = names[i % len(names) :] + names[: i % len(names)]  # rotate who goes first
        for name in order:
            t0 = time.perf_counter_ns()
            status = await clients[name].request()
            elapsed = (time.perf_counter_ns() - t0) / 1e6
            if status != 200:
                raise RuntimeError(f"{name}: HTTP {status}")
            if i >= 200:  # warm-up rounds are discarded
                samples[name].append(elapsed)
    for client in clients.values():
        client.transport.close()
    return samples


async def throughput(port: int, connections: int, seconds: float) -> float:
    clients = [await connect(port) for _ in range(connections)]
    done = 0
    stop = time.perf_counter() + seconds
    warm_until = time.perf_counter() + min(1.0, seconds / 4)
    started_at: float | None = None

    async def loop(client: Client) -> None:
        nonlocal done, started_at
        while (now := time.perf_counter()) < stop:
            await client.request()
            if now >= warm_until:
                if started_at is None:
                    started_at = now
                done += 1

    await asyncio.gather(*(loop(c) for c in clients))
    for client in clients:
        client.transport.close()
    assert started_at is not None
    return done / (time.perf_counter() - started_at)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# --------------------------------------------------------------------------- orchestration


def spawn(role: str, cpu: int | None, *extra: str) -> tuple[subprocess.Popen[str], int]:
    cmd = [sys.executable, __file__, "--role", role, *extra]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", choices=["upstream", "bare", "proxy"])
    parser.add_argument("--upstream-url")
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--ring", type=int, help="size of the proxy's in-memory record ring")
    parser.add_argument(
        "--pin",
        metavar="CPUS",
        help="pin upstream,bare,proxy,loadgen to these 4 CPUs, e.g. 2,4,6,8 (Linux taskset)",
    )
    args = parser.parse_args()
    if args.role == "upstream":
        return run_upstream(0)
    if args.role == "bare":
        return run_bare(0, args.upstream_url)
    if args.role == "proxy":
        return run_proxy(0, args.upstream_url, args.ring)

    cpus: tuple[int | None, ...] = (None,) * 4
    if args.pin:
        cpus = tuple(int(c) for c in args.pin.split(","))
        if len(cpus) != 4:
            parser.error("--pin needs 4 CPUs")
    procs = []
    try:
        up, up_port = spawn("upstream", cpus[0])
        procs.append(up)
        url = f"http://127.0.0.1:{up_port}"
        bare, bare_port = spawn("bare", cpus[1], "--upstream-url", url)
        procs.append(bare)
        ring = ["--ring", str(args.ring)] if args.ring is not None else []
        proxy, proxy_port = spawn("proxy", cpus[2], "--upstream-url", url, *ring)
        procs.append(proxy)
        if cpus[3] is not None:
            os.sched_setaffinity(0, {cpus[3]})
        ports = {"direct": up_port, "bare": bare_port, "proxy": proxy_port}
        import uvloop

        samples = uvloop.run(latency(ports, args.rounds))
        print(f"CPUs: {os.cpu_count()}  pinned: {args.pin}  rounds: {args.rounds}")
        print("sequential keep-alive latency (ms), interleaved:")
        print(
            f"  {'target':8} {'p50':>8} {'p99':>8} {'mean':>8} {'added p50':>10} {'added p99':>10}"
        )
        d50, d99 = pct(samples["direct"], 0.5), pct(samples["direct"], 0.99)
        for name, values in samples.items():
            p50, p99 = pct(values, 0.5), pct(values, 0.99)
            print(
                f"  {name:8} {p50:8.3f} {p99:8.3f} {statistics.fmean(values):8.3f}"
                f" {p50 - d50:10.3f} {p99 - d99:10.3f}"
            )
        bare_added = pct(samples["bare"], 0.5) - d50
        proxy_added = pct(samples["proxy"], 0.5) - d50
        ratio = proxy_added / bare_added
        print(f"  proxy/bare added-latency ratio at p50: {ratio:.2f} (target <= 1.3)")
        print(
            f"non-streaming throughput ({args.connections} connections, {args.seconds:.0f} s"
            f" per trial, {args.trials} alternating trials): median / max"
        )
        rates: dict[str, list[float]] = {"bare": [], "proxy": []}
        for _ in range(args.trials):
            for name, port in (("bare", bare_port), ("proxy", proxy_port)):
                rates[name].append(uvloop.run(throughput(port, args.connections, args.seconds)))
        for name, values in rates.items():
            print(f"  {name:8} {statistics.median(values):9.0f} {max(values):9.0f} req/s")
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


if __name__ == "__main__":
    main()
