"""Proxy overhead and throughput, beside a bare aiohttp pass-through measured in the same run.

Processes (each its own interpreter, uvloop everywhere):
  upstream  a raw-asyncio HTTP/1.1 server answering every POST with the real vLLM non-streaming
            body (`chat_nonstream_spec.json`): as cheap as possible, so it is not the bottleneck;
  sse-upstream  (streaming mode) a paced SSE mock: `--events` chunks `--gap-ms` apart;
  replay-upstream  (stream-throughput mode) replays the recorded vLLM chat stream, one event
            per HTTP chunk, `--replay-gap-ms` apart;
  bare      the few-line aiohttp pass-through (one ClientSession, read body, post, return or
            stream through);
  proxy     specproxy's app (routing, JSON body parse, usage parse, record, Prometheus), with the
            in-memory ring (or `--store URL`), GC frozen after start-up as `specproxy serve` does;
  loadgen   this process: raw-asyncio keep-alive clients (no HTTP library on the hot path).

Added latency: sequential keep-alive requests, interleaved direct / bare / proxy round by round
so that drift and noise hit all three alike; added = percentile(target) - percentile(direct),
per trial, then the median over trials. Throughput: closed loop, `--connections` keep-alive
connections for `--seconds` per target, trials alternating bare / proxy; beside req/s it prints
requests per CPU-second of the target process, which is what one process could serve with a
core to itself (req/s on a shared machine mostly measures the other tenants). Streaming:
sequential streams, interleaved; added TTFT and added inter-event gap at p50/p99. Streaming
throughput: closed loop, `--stream-connections` clients each streaming the recorded vLLM chat
stream back to back, trials alternating bare / proxy; streams/s and events/s (events counted at
the client), each also per CPU-second of the target, and the proxy/bare ratio. The load
average is printed at start and end. With `--pin`, processes are pinned (Linux taskset).

    .venv/bin/python benchmarks/bench_proxy.py --mode all --pin 0,1,1,0 [--rounds 3000]
        [--seconds 5] [--connections 64] [--trials 3] [--streams 20] [--events 64] [--gap-ms 20]
        [--stream-connections 32] [--replay-gap-ms 1]
        [--workers N]   # the proxy target is `specproxy serve --workers N` (CPU of all workers)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

BODY = (
    Path(__file__).resolve().parents[1] / "tests/fixtures/vllm-0.32.0-cpu/chat_nonstream_spec.json"
)
REQUEST_BODY = b'{"model":"tiny-llama","messages":[{"role":"user","content":"Hello there"}]}'
PATH = "/v1/chat/completions"


# --------------------------------------------------------------------------- roles


NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"  # GETs (the scraper)


class RawServer(asyncio.Protocol):
    """A raw-asyncio HTTP/1.1 server: frames requests by Content-Length, answers GETs 404 and
    each POST with `answer(body)`; as cheap as possible, so it is not the bottleneck."""

    def __init__(self, answer: Callable[[RawServer, bytes], None]) -> None:
        self.answer = answer
        self.transport: Any = None
        self.buf = b""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

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
            get = self.buf.startswith(b"GET")
            body = self.buf[head_end + 4 : end]
            self.buf = self.buf[end:]
            if get:
                self.transport.write(NOT_FOUND)
            else:
                self.answer(self, body)


def serve_raw(port: int, answer: Callable[[RawServer, bytes], None]) -> None:
    async def main() -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(
            lambda: RawServer(answer), "127.0.0.1", port, backlog=4096
        )
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    _run(main())


def run_upstream(port: int) -> None:
    """Every POST gets the real vLLM non-streaming body (`chat_nonstream_spec.json`)."""
    body = BODY.read_bytes()
    response = (
        b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: application/json\r\n"
        b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    serve_raw(port, lambda server, _: server.transport.write(response))


def run_sse_upstream(port: int, events: int, gap_s: float) -> None:
    """A paced SSE mock: `events` chat chunks, one every `gap_s` on an absolute schedule from the
    request's arrival (so a late write never shifts the later ones), chunked like uvicorn, then
    the usage chunk when the request asked for it, then [DONE]."""
    head = (
        b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    prefix = b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m",'
    lines = [
        prefix + b'"choices":[{"index":0,"delta":{"content":"tok%d"},"logprobs":null,'
        b'"finish_reason":null}]}\n\n' % i
        for i in range(events - 1)
    ]
    lines.append(
        prefix + b'"choices":[{"index":0,"delta":{"content":"end"},"logprobs":null,'
        b'"finish_reason":"length","stop_reason":null}]}\n\n'
    )
    usage = prefix + b'"choices":[],"usage":{"prompt_tokens":5,"total_tokens":%d,' % (5 + events)
    usage += b'"completion_tokens":%d}}\n\n' % events

    def chunk(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                request_head = (await reader.readuntil(b"\r\n\r\n")).lower()
                if request_head.startswith(b"get"):  # the proxy's scraper: nothing to scrape
                    writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                    continue
                at = request_head.find(b"content-length:")
                end = request_head.find(b"\r\n", at)
                body = await reader.readexactly(int(request_head[at + 15 : end]) if at >= 0 else 0)
                start = loop.time()
                writer.write(head)
                for i, line in enumerate(lines):
                    await asyncio.sleep(max(0.0, start + (i + 1) * gap_s - loop.time()))
                    if i < len(lines) - 1:
                        writer.write(chunk(line))
                        continue
                    tail = usage if b'"include_usage":true' in body else b""
                    writer.write(chunk(line + tail + b"data: [DONE]\n\n") + b"0\r\n\r\n")
                await writer.drain()
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=4096)
        print(server.sockets[0].getsockname()[1], flush=True)
        await asyncio.Event().wait()

    _run(main())


FIXTURES = BODY.parent


def run_replay_upstream(port: int, gap_s: float) -> None:
    """Replays a recorded vLLM chat stream (`chat_stream_{usage,nousage}_spec.sse`, the one
    that matches the request's `include_usage`), one event per HTTP chunk as uvicorn writes
    them, `gap_s` apart (0: all at once)."""
    head = (
        b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"transfer-encoding: chunked\r\n\r\n"
    )
    replies = {}
    for usage in (True, False):
        raw = (FIXTURES / f"chat_stream_{'usage' if usage else 'nousage'}_spec.sse").read_bytes()
        events = [e + b"\n\n" for e in raw.split(b"\n\n") if e]
        replies[usage] = [b"%x\r\n%s\r\n" % (len(e), e) for e in events]
        replies[usage][-1] += b"0\r\n\r\n"

    def write(transport: Any, piece: bytes) -> None:
        if not transport.is_closing():
            transport.write(piece)

    def answer(server: RawServer, body: bytes) -> None:
        chunks = replies[b'"include_usage":true' in body]
        if not gap_s:
            server.transport.write(head + b"".join(chunks))
            return
        server.transport.write(head)
        loop = asyncio.get_running_loop()
        for i, piece in enumerate(chunks):
            loop.call_later((i + 1) * gap_s, write, server.transport, piece)

    serve_raw(port, answer)


def run_bare(port: int, upstream: str) -> None:
    from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

    async def main() -> None:
        session = ClientSession(connector=TCPConnector(limit=0), timeout=ClientTimeout(total=None))

        async def handle(request: web.Request) -> web.StreamResponse:
            body = await request.read()
            async with session.post(
                upstream + request.path, data=body, headers=request.headers
            ) as r:
                if r.content_type == "text/event-stream":  # streamed through as it arrives
                    resp = web.StreamResponse(status=r.status)
                    resp.content_type = r.content_type
                    await resp.prepare(request)
                    async for data in r.content.iter_any():
                        await resp.write(data)
                    await resp.write_eof()
                    return resp
                payload = await r.read()
                return web.Response(body=payload, status=r.status, content_type=r.content_type)

        app = web.Application()
        app.router.add_post(PATH, handle)
        await _serve(app, port)

    _run(main())


def run_proxy(port: int, upstream: str, ring: int | None, store: str | None) -> None:
    """specproxy with the in-memory ring (default) or, with `store`, a real store as recorder."""
    from specproxy.app import create_app
    from specproxy.config import Config, StoreConfig
    from specproxy.proxy.recorder import MemoryRecorder
    from specproxy.serve import freeze_startup_objects

    async def main() -> None:
        if store:
            cfg = Config(baseline_url=upstream, speculative_url=upstream, store=StoreConfig(store))
            app = create_app(cfg)
        else:
            cfg = Config(baseline_url=upstream, speculative_url=upstream)
            recorder = MemoryRecorder(ring) if ring is not None else MemoryRecorder()
            app = create_app(cfg, recorder=recorder, with_store=False, with_stats=False)
        app.on_startup.append(freeze_startup_objects)  # as `specproxy serve` does
        await _serve(app, port)

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


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and its live children so far (Linux /proc): with
    `--workers`, the target is `specproxy serve`'s parent and the workers are its children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    own = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    children = Path(f"/proc/{pid}/task/{pid}/children")
    kids = [int(c) for c in children.read_text().split()] if children.exists() else []
    return own + sum(cpu_seconds(kid) for kid in kids)


async def throughput(port: int, connections: int, seconds: float, pid: int) -> tuple[float, float]:
    """Closed-loop req/s, and req per CPU-second of the target process (its own capacity, less
    sensitive than req/s to other load on a shared machine)."""
    clients = [await connect(port) for _ in range(connections)]
    done = 0
    stop = time.perf_counter() + seconds
    warm_until = time.perf_counter() + min(1.0, seconds / 4)
    started_at: float | None = None

    cpu_at_start = 0.0

    async def loop(client: Client) -> None:
        nonlocal done, started_at, cpu_at_start
        while (now := time.perf_counter()) < stop:
            await client.request()
            if now >= warm_until:
                if started_at is None:
                    started_at = now
                    cpu_at_start = cpu_seconds(pid)
                done += 1

    await asyncio.gather(*(loop(c) for c in clients))
    cpu = cpu_seconds(pid) - cpu_at_start
    for client in clients:
        client.transport.close()
    assert started_at is not None
    return done / (time.perf_counter() - started_at), done / cpu


STREAM_BODY = (
    b'{"model":"m","stream":true,"max_tokens":64,'
    b'"messages":[{"role":"user","content":"Hello there"}]}'
)


async def one_stream(pool: Any) -> tuple[float, list[float]]:
    """One streamed request: (TTFT, [inter-event gaps]) as the client sees them, in ms."""
    headers = [("Content-Type", "application/json")]
    t0 = time.perf_counter()
    resp = await pool.post(PATH, STREAM_BODY, headers)
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}")
    stamps: list[float] = []
    tail = b""
    while data := await resp.readany():
        now = time.perf_counter()
        tail += data
        events = tail.count(b"\n\n")
        if events:
            stamps.extend([now] * events)
            tail = tail[tail.rfind(b"\n\n") + 2 :]
    resp.release()
    gaps = [(b - a) * 1e3 for a, b in itertools.pairwise(stamps)]
    return (stamps[0] - t0) * 1e3, gaps


async def stream_latency(
    ports: dict[str, int], streams: int
) -> dict[str, tuple[list[float], list[float]]]:
    """Sequential streams, interleaved across targets round by round (3 warm-up rounds).

    The client is specproxy's lean HTTP/1.1 client: cheap, and the same for every target."""
    from specproxy.proxy.transports.lean import UpstreamPool

    pools = {
        name: UpstreamPool("127.0.0.1", port, connect_timeout=5.0, read_timeout=60.0)
        for name, port in ports.items()
    }
    out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in ports}
    names = list(ports)
    for i in range(streams + 3):
        order = names[i % len(names) :] + names[: i % len(names)]
        for name in order:
            ttft, gaps = await one_stream(pools[name])
            if i >= 3:
                out[name][0].append(ttft)
                out[name][1].extend(gaps)
    for pool in pools.values():
        await pool.close()
    return out


async def stream_throughput(
    port: int, connections: int, seconds: float, pid: int
) -> tuple[float, float, float, float]:
    """Closed-loop streams: (streams/s, events/s, streams/CPU-s, events/CPU-s of the target).

    `connections` keep-alive clients (specproxy's lean client, the same for every target) each
    send a streamed chat request as soon as the previous stream ended; events are counted at the
    client by their blank-line ends. The first quarter (at most 1 s) is warm-up."""
    from specproxy.proxy.transports.lean import UpstreamPool

    pool = UpstreamPool("127.0.0.1", port, connect_timeout=5.0, read_timeout=60.0)
    headers = [("Content-Type", "application/json")]
    streams = events = 0
    start = time.perf_counter()
    stop = start + seconds
    warm_until = start + min(1.0, seconds / 4)
    started_at: float | None = None
    cpu_at_start = 0.0

    async def loop() -> None:
        nonlocal streams, events, started_at, cpu_at_start
        while time.perf_counter() < stop:
            resp = await pool.post(PATH, STREAM_BODY, headers)
            if resp.status != 200:
                raise RuntimeError(f"HTTP {resp.status}")
            n = 0
            tail = b""
            while data := await resp.readany():
                tail += data
                n += tail.count(b"\n\n")
                tail = tail[tail.rfind(b"\n\n") + 2 :] if b"\n\n" in tail else tail
            resp.release()
            now = time.perf_counter()
            if now >= warm_until:
                if started_at is None:
                    started_at = now
                    cpu_at_start = cpu_seconds(pid)
                    continue
                streams += 1
                events += n

    await asyncio.gather(*(loop() for _ in range(connections)))
    cpu = cpu_seconds(pid) - cpu_at_start
    await pool.close()
    assert started_at is not None
    wall = time.perf_counter() - started_at
    return streams / wall, events / wall, streams / cpu, events / cpu


def report_stream_throughput(
    ports: dict[str, int], pids: dict[str, int], args: argparse.Namespace
) -> None:
    import uvloop

    print(
        f"streaming throughput: a recorded vLLM chat stream (chat_stream_*_spec.sse, 12 events"
        f" to the client) replayed {args.replay_gap_ms:g} ms apart, {args.stream_connections}"
        f" connections, {args.seconds:.0f} s per trial, {args.trials} alternating trials;"
        " per CPU-s = per CPU-second of the target process:"
    )
    rates: dict[str, list[tuple[float, float, float, float]]] = {"bare": [], "proxy": []}
    for _ in range(args.trials):
        for name in rates:
            rates[name].append(
                uvloop.run(
                    stream_throughput(
                        ports[name], args.stream_connections, args.seconds, pids[name]
                    )
                )
            )
    medians = {}
    for name, values in rates.items():
        med = medians[name] = [statistics.median(v[i] for v in values) for i in range(4)]
        print(
            f"  {name:8} streams/s median {med[0]:6.0f}  events/s median {med[1]:7.0f}"
            f"   streams/CPU-s median {med[2]:6.0f}  events/CPU-s median {med[3]:7.0f}"
            f"   (streams/s trials: {', '.join(f'{v[0]:.0f}' for v in values)})"
        )
    bare, proxy = medians["bare"], medians["proxy"]
    print(
        f"  proxy/bare streams/s {proxy[0] / bare[0]:.2f}x, streams/CPU-s"
        f" {proxy[2] / bare[2]:.2f}x (target >= 0.9x)"
    )


def report_stream(ports: dict[str, int], args: argparse.Namespace) -> None:
    import uvloop

    print(
        f"streaming against a paced SSE mock ({args.events} events, {args.gap_ms:g} ms apart),"
        f" {args.trials} trials x {args.streams} sequential streams per target, interleaved;"
        " added = target - direct at the same percentile (ms):"
    )
    print(
        f"  {'target':8} {'TTFT p50':>9} {'TTFT p99':>9} {'+TTFT p50':>9} {'+TTFT p99':>9}"
        f" {'gap p50':>9} {'gap p99':>9} {'+gap p50':>9} {'+gap p99':>9}"
    )
    added: dict[str, list[tuple[float, ...]]] = {"bare": [], "proxy": []}
    for _ in range(args.trials):
        result = uvloop.run(stream_latency(ports, args.streams))
        d_ttft, d_gaps = result["direct"]
        for name, (ttft, gaps) in result.items():
            row = (
                pct(ttft, 0.5),
                pct(ttft, 0.99),
                pct(ttft, 0.5) - pct(d_ttft, 0.5),
                pct(ttft, 0.99) - pct(d_ttft, 0.99),
                pct(gaps, 0.5),
                pct(gaps, 0.99),
                pct(gaps, 0.5) - pct(d_gaps, 0.5),
                pct(gaps, 0.99) - pct(d_gaps, 0.99),
            )
            print(f"  {name:8} " + " ".join(f"{v:9.3f}" for v in row))
            if name in added:
                added[name].append(row[2:4] + row[6:8])
    for name, rows in added.items():
        med = [statistics.median(r[i] for r in rows) for i in range(4)]
        print(
            f"  median over trials, {name:5}: added TTFT p50 {med[0]:.3f} p99 {med[1]:.3f};"
            f" added gap p50 {med[2]:.3f} p99 {med[3]:.3f}"
        )


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


def spawn_serve(
    upstream: str, workers: int, store: str | None, cpu: int | None
) -> tuple[subprocess.Popen[str], int]:
    """`specproxy serve --workers N` in front of `upstream`; returns once it answers."""
    import socket
    import tempfile
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = store or f"sqlite:///{tempfile.mkdtemp(prefix='bench-serve-')}/bench.db"
    cmd = [sys.executable, "-m", "specproxy", "serve", "--workers", str(workers)]
    cmd += ["--port", str(port), "--baseline", upstream, "--speculative", upstream]
    cmd += ["--store", store]
    if cpu is not None:
        cmd = ["taskset", "-c", str(cpu), *cmd]
    proc = subprocess.Popen(cmd, stderr=subprocess.DEVNULL, text=True)
    for _ in range(600):
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1):
                break
        except OSError:
            time.sleep(0.1)
    time.sleep(1.0)  # every worker listening, not just the first
    return proc, port


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--role", choices=["upstream", "sse-upstream", "replay-upstream", "bare", "proxy"]
    )
    parser.add_argument("--upstream-url")
    parser.add_argument(
        "--mode",
        choices=["nonstream", "stream", "stream-throughput", "all"],
        default="nonstream",
        help="non-streaming latency + throughput, streaming TTFT/gaps, streaming throughput"
        " (streams/s, events/s), or all three",
    )
    parser.add_argument("--rounds", type=int, default=3000, help="latency rounds per trial")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--ring", type=int, help="size of the proxy's in-memory record ring")
    parser.add_argument("--store", metavar="URL", help="proxy records into this store instead")
    parser.add_argument(
        "--workers",
        type=int,
        help="measure `specproxy serve --workers N` (SQLite store in a temp dir, or --store)",
    )
    parser.add_argument("--streams", type=int, default=20, help="streams per target per trial")
    parser.add_argument("--events", type=int, default=64, help="SSE events per stream")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pacing of the SSE mock")
    parser.add_argument(
        "--stream-connections", type=int, default=32, help="streaming throughput connections"
    )
    parser.add_argument(
        "--replay-gap-ms",
        type=float,
        default=1.0,
        help="streaming throughput: pacing of the recorded stream's events (0: all at once)",
    )
    parser.add_argument(
        "--pin",
        metavar="CPUS",
        help="pin upstream,bare,proxy,loadgen to these 4 CPUs, e.g. 0,1,1,0 (Linux taskset)",
    )
    args = parser.parse_args()
    if args.role == "upstream":
        return run_upstream(0)
    if args.role == "sse-upstream":
        return run_sse_upstream(0, args.events, args.gap_ms / 1000.0)
    if args.role == "replay-upstream":
        return run_replay_upstream(0, args.replay_gap_ms / 1000.0)
    if args.role == "bare":
        return run_bare(0, args.upstream_url)
    if args.role == "proxy":
        return run_proxy(0, args.upstream_url, args.ring, args.store)

    cpus: tuple[int | None, ...] = (None,) * 4
    if args.pin:
        cpus = tuple(int(c) for c in args.pin.split(","))
        if len(cpus) != 4:
            parser.error("--pin needs 4 CPUs")
    if cpus[3] is not None:
        os.sched_setaffinity(0, {cpus[3]})
    print(f"CPUs: {os.cpu_count()}  pinned (upstream,bare,proxy,loadgen): {args.pin}")
    print(f"load average at start: {_loadavg()}")
    if args.mode in ("nonstream", "all"):
        with _targets(args, "upstream", cpus) as (ports, pids):
            report_latency(ports, args.rounds, args.trials)
            report_throughput(ports, pids, args)
    if args.mode in ("stream", "all"):
        sse = ["--events", str(args.events), "--gap-ms", str(args.gap_ms)]
        with _targets(args, "sse-upstream", cpus, sse) as (ports, _):
            report_stream(ports, args)
    if args.mode in ("stream-throughput", "all"):
        replay = ["--replay-gap-ms", str(args.replay_gap_ms)]
        with _targets(args, "replay-upstream", cpus, replay) as (ports, pids):
            report_stream_throughput(ports, pids, args)
    print(f"load average at end: {_loadavg()}")


def _loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextlib.contextmanager
def _targets(
    args: argparse.Namespace,
    upstream_role: str,
    cpus: tuple[int | None, ...],
    upstream_args: list[str] | None = None,
) -> Iterator[tuple[dict[str, int], dict[str, int]]]:
    """Start upstream, bare and proxy processes; yield their ports and pids; stop them."""
    procs: list[subprocess.Popen[str]] = []
    try:
        up, up_port = spawn(upstream_role, cpus[0], *(upstream_args or []))
        procs.append(up)
        url = f"http://127.0.0.1:{up_port}"
        bare, bare_port = spawn("bare", cpus[1], "--upstream-url", url)
        procs.append(bare)
        if args.workers:
            proxy, proxy_port = spawn_serve(url, args.workers, args.store, cpus[2])
        else:
            extra = ["--ring", str(args.ring)] if args.ring is not None else []
            extra += ["--store", args.store] if args.store else []
            proxy, proxy_port = spawn("proxy", cpus[2], "--upstream-url", url, *extra)
        procs.append(proxy)
        ports = {"direct": up_port, "bare": bare_port, "proxy": proxy_port}
        yield ports, {"direct": up.pid, "bare": bare.pid, "proxy": proxy.pid}
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait()


def report_latency(ports: dict[str, int], rounds: int, trials: int) -> None:
    import uvloop

    print(f"sequential keep-alive latency (ms), interleaved, {trials} trials x {rounds} rounds:")
    print(f"  {'trial':5} {'target':8} {'p50':>8} {'p99':>8} {'added p50':>10} {'added p99':>10}")
    ratios = []
    added: dict[str, list[tuple[float, float]]] = {"bare": [], "proxy": []}
    for trial in range(trials):
        samples = uvloop.run(latency(ports, rounds))
        d50, d99 = pct(samples["direct"], 0.5), pct(samples["direct"], 0.99)
        for name, values in samples.items():
            p50, p99 = pct(values, 0.5), pct(values, 0.99)
            print(f"  {trial:5} {name:8} {p50:8.3f} {p99:8.3f} {p50 - d50:10.3f} {p99 - d99:10.3f}")
            if name in added:
                added[name].append((p50 - d50, p99 - d99))
        ratios.append(added["proxy"][-1][0] / added["bare"][-1][0])
    for name, pairs in added.items():
        p50 = statistics.median(v[0] for v in pairs)
        p99 = statistics.median(v[1] for v in pairs)
        print(f"  median added latency {name:5}: p50 {p50:.3f} ms, p99 {p99:.3f} ms")
    print(
        f"  proxy/bare added-latency ratio at p50: median {statistics.median(ratios):.2f}"
        f" (trials: {', '.join(f'{r:.2f}' for r in ratios)}; target <= 1.3)"
    )


def report_throughput(
    ports: dict[str, int], pids: dict[str, int], args: argparse.Namespace
) -> None:
    import uvloop

    print(
        f"non-streaming throughput ({args.connections} connections, {args.seconds:.0f} s per"
        f" trial, {args.trials} alternating trials); req/CPU-s = requests per CPU-second of"
        " the target process:"
    )
    rates: dict[str, list[tuple[float, float]]] = {"bare": [], "proxy": []}
    for _ in range(args.trials):
        for name in rates:
            rates[name].append(
                uvloop.run(throughput(ports[name], args.connections, args.seconds, pids[name]))
            )
    for name, values in rates.items():
        wall = [v[0] for v in values]
        per_cpu = [v[1] for v in values]
        print(
            f"  {name:8} req/s median {statistics.median(wall):6.0f} max {max(wall):6.0f}"
            f"   req/CPU-s median {statistics.median(per_cpu):6.0f}"
            f"   (trials: {', '.join(f'{w:.0f}' for w in wall)})"
        )


if __name__ == "__main__":
    main()
