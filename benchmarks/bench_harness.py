"""How much does the bench harness itself cost? Prints figures; asserts nothing.

A fake OpenAI server runs in a separate process (so it does not share the harness's event loop)
and answers instantly: 32 tokens streamed as 16 SSE events, plus the usage chunk. Against such a
server everything measured is overhead (harness + loopback + the fake's own aiohttp), an upper
bound on what the harness adds to a real measurement. It reports:

- E2E per request against the instant server (closed loop, concurrency 1 and 8);
- the harness's own SSE parsing time per request (`parse_ns`);
- open-loop send lateness versus the Poisson schedule at a moderate rate;
- the request rate harness and fake together sustain (at c=8 the E2E is queueing for that CPU);
and sets them against the latency of a real request (the vLLM CPU fixtures measured a 75 ms
speculative median; the emulated demo arms are tens to hundreds of ms).

Run: .venv/bin/python benchmarks/bench_harness.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import time
from typing import Any

import aiohttp
import numpy as np
from aiohttp import web

from specproxy.loadgen import ClientResult, LoadGenerator, RequestOptions, Target
from specproxy.prompts import default_prompts

REFERENCE_LATENCY_S = 0.075  # median speculative E2E of the real vLLM CPU fixtures


def _instant_app() -> web.Application:
    chunk = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "ab"}}]}).encode()
    usage = {"prompt_tokens": 10, "completion_tokens": 32, "total_tokens": 42}
    tail = b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    body = (chunk + b"\n\n") * 16 + tail + b"data: [DONE]\n\n"

    async def complete(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(body)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", complete)
    return app


def _serve(sock: socket.socket) -> None:
    web.run_app(_instant_app(), sock=sock, print=None, handle_signals=True)


def _quantiles_ms(values: list[float]) -> str:
    arr = np.array(values) * 1e3
    return f"p50 {np.median(arr):.3f} ms, p99 {np.quantile(arr, 0.99):.3f} ms"


async def _measure(url: str, requests: int) -> None:
    prompts = default_prompts()
    options = RequestOptions(model="m")
    target = [Target(url, "baseline")]
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        warm = LoadGenerator(session, target, prompts, options)
        await warm.run_closed_loop(4, count=200)
        rows: list[tuple[str, list[ClientResult], float]] = []
        for concurrency in (1, 8):
            gen = LoadGenerator(session, target, prompts, options, seed=concurrency)
            t0 = time.perf_counter()
            results = await gen.run_closed_loop(concurrency, count=requests)
            rows.append((f"closed loop c={concurrency}", results, time.perf_counter() - t0))
        gen = LoadGenerator(session, target, prompts, options, seed=99)
        t0 = time.perf_counter()
        results = await gen.run_open_loop(100.0, count=requests // 2)
        rows.append(("open loop 100/s", results, time.perf_counter() - t0))
    for name, results, wall in rows:
        ok = [r for r in results if r.ok]
        e2e = [r.e2e_ns / 1e9 for r in ok]
        parse = [r.parse_ns / 1e9 for r in ok]
        print(f"{name:18s} n={len(ok)}  E2E vs instant server: {_quantiles_ms(e2e)}")
        print(f"{'':18s} SSE parsing per request: {_quantiles_ms(parse)}")
        print(f"{'':18s} throughput (harness + instant server): {len(ok) / wall:.0f} req/s")
        if name.startswith("open"):
            late = [r.lateness_ns / 1e9 for r in ok]
            print(f"{'':18s} send lateness vs schedule: {_quantiles_ms(late)}")
        share = float(np.median(e2e)) / REFERENCE_LATENCY_S
        print(
            f"{'':18s} median overhead = {share:.2%} "
            f"of a {REFERENCE_LATENCY_S * 1e3:.0f} ms request"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=2000)
    args: Any = parser.parse_args(argv)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = multiprocessing.get_context("spawn").Process(target=_serve, args=(sock,), daemon=True)
    server.start()
    try:
        asyncio.run(_measure(f"http://127.0.0.1:{port}", args.requests))
    finally:
        server.terminate()
        server.join(5)
        sock.close()


if __name__ == "__main__":
    main()
