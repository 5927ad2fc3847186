"""Distinct client `model` strings against `specproxy serve`: /metrics series and RSS stay flat.

Starts bench_proxy's cheap upstream (answers any model) and `specproxy serve` with a SQLite
store in a temp dir, then sends rounds of requests, each request with a model name never used
before. After every round it prints the proxy's RSS, the number of `specproxy_*` series on
/metrics, the size and model keys of /api/stats, and the distinct `model` label values.

    .venv/bin/python benchmarks/bench_model_labels.py [--rounds 4] [--per-round 2500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import aiohttp

BENCH = Path(__file__).resolve().parent / "bench_proxy.py"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def send(session: aiohttp.ClientSession, url: str, start: int, count: int) -> None:
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        body = {"model": f"client-model-{i}", "messages": [{"role": "user", "content": "hi"}]}
        async with sem, session.post(url + "/v1/chat/completions", json=body) as resp:
            await resp.read()
            assert resp.status == 200, resp.status

    await asyncio.gather(*(one(i) for i in range(start, start + count)))


async def measure(args: argparse.Namespace, url: str, pid: int) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            try:
                async with session.get(url + "/healthz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                await asyncio.sleep(0.1)
        print(
            f"{'requests':>9} {'distinct models sent':>21} {'RSS MiB':>8} "
            f"{'specproxy_ series':>18} {'/api/stats bytes, models':>25} {'label values':>13}"
        )
        for r in range(args.rounds + 1):
            if r:
                await send(session, url, (r - 1) * args.per_round, args.per_round)
            await asyncio.sleep(0.5)
            async with session.get(url + "/metrics") as resp:
                text = await resp.text()
            async with session.get(url + "/api/stats") as resp:
                raw = await resp.read()
            stats = json.loads(raw) if resp.status == 200 else {"results": {}}
            series = [ln for ln in text.splitlines() if ln.startswith("specproxy_")]
            models = sorted(set(re.findall(r'model="([^"]*)"', text)))
            n = r * args.per_round
            print(
                f"{n:9d} {n:21d} {rss_mib(pid):8.1f} {len(series):18d} {len(raw):9d} "
                f"{sorted(stats['results'])} {len(models):5d} {models}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--per-round", type=int, default=2500)
    args = parser.parse_args()
    upstream = subprocess.Popen(
        [sys.executable, str(BENCH), "--role", "upstream"], stdout=subprocess.PIPE, text=True
    )
    assert upstream.stdout is not None
    up = f"http://127.0.0.1:{int(upstream.stdout.readline())}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    db = Path(tempfile.mkdtemp(prefix="bench-models-")) / "store.db"
    cmd = [sys.executable, "-m", "specproxy", "serve", "--port", str(port), "--baseline", up]
    cmd += ["--speculative", up, "--store", f"sqlite:///{db}"]
    proxy = subprocess.Popen(cmd, stderr=subprocess.DEVNULL)
    try:
        asyncio.run(measure(args, f"http://127.0.0.1:{port}", proxy.pid))
    finally:
        proxy.terminate()
        upstream.terminate()
        proxy.wait()
        upstream.wait()


if __name__ == "__main__":
    main()
