"""The interleaved one-connection latency client (`benchmarks/added_latency.py`): its framing of
answers, its rounds and its paired statistics. Timings are not asserted, only structure."""

from __future__ import annotations

import math

from aiohttp import web
from aiohttp.test_utils import TestServer

from benchmarks import added_latency


def test_median_interval_is_the_binomial_order_statistics() -> None:
    med, lo, hi = added_latency.median_interval([float(x) for x in range(101)])
    # k = floor(101/2 - 1.96 * sqrt(101) / 2) = 40: the 41st and 61st of 101 ordered values
    assert (med, lo, hi) == (50.0, 40.0, 60.0)
    assert all(math.isnan(v) for v in added_latency.median_interval([]))


def test_summarize_subtracts_direct_and_pairs_with_bare() -> None:
    names = ["direct", "bare", "ours"]
    rounds = [[1.0 + i, 2.0 + i, 1.5 + i] for i in range(5)]  # drift moves every target alike
    out = added_latency.summarize(names, rounds)
    assert out["rounds"] == 5
    assert out["bare"]["added_p50_s"] == 1.0
    assert out["ours"]["added_p50_s"] == 0.5
    assert out["ours"]["vs_bare_s"] == -0.5
    assert "vs_bare_s" not in out["bare"] and "vs_bare_s" not in out["direct"]


async def test_rounds_reach_every_target_through_both_framings() -> None:
    """A Content-Length answer and a chunked stream written in pieces: each request completes
    only at its answer's last byte, on one kept-alive connection per target."""
    served: dict[str, int] = {"json": 0, "stream": 0}

    async def plain(request: web.Request) -> web.Response:
        await request.read()
        served["json"] += 1
        return web.json_response({"ok": True})

    async def stream(request: web.Request) -> web.StreamResponse:
        await request.read()
        served["stream"] += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for piece in (b"data: 1\n\n", b"data: 2\n\n", b"data: [DONE]\n\n"):
            await resp.write(piece)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/json/v1/chat/completions", plain)
    app.router.add_post("/v1/chat/completions", stream)
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        port = server.port
        assert port is not None
        targets = [(port, "/json/v1/chat/completions"), (port, "/v1/chat/completions")]
        rounds = await added_latency.interleave(targets, stream=True, seconds=0.05, warmup=0.0)
        assert rounds and all(len(row) == 2 and min(row) > 0 for row in rounds)
        assert served == {"json": len(rounds), "stream": len(rounds)}  # one each, no retry
        served.update(json=0, stream=0)
        bursts = await added_latency.interleave(
            targets, stream=True, seconds=0.0, warmup=0.0, burst=4, think_s=0.0001
        )
    assert len(bursts) == 1 and min(bursts[0]) > 0  # at least one round, however slow
    assert served == {"json": 4, "stream": 4}  # a burst: 4 requests to each target in its turn


def test_request_bytes_frame_a_json_body() -> None:
    data = added_latency.request_bytes("/v1/chat/completions", stream=True)
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert b'"stream":true' in body


async def test_the_client_role_passes_burst_and_think_time_on() -> None:
    """`--role client` as the face-off runs it, a burst of 2 with 0.3 s of think time: the
    second request of the burst reaches the server at least 0.3 s after the first (a lower
    bound the client's own waiting guarantees, however slow the machine)."""
    import asyncio
    import json
    import sys
    import time
    from pathlib import Path

    arrivals: list[float] = []

    async def plain(request: web.Request) -> web.Response:
        await request.read()
        arrivals.append(time.perf_counter())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", plain)
    script = Path(added_latency.__file__)
    async with TestServer(app, host="127.0.0.1", port=0) as server:
        targets = json.dumps([[server.port, "/v1/chat/completions"]])
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(script), "--role", "client", "--targets", targets,
            "--seconds", "0", "--warmup", "0", "--burst", "2", "--think-us", "300000",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert len(json.loads(out)) == 1 and len(arrivals) == 2
    assert arrivals[1] - arrivals[0] >= 0.3
