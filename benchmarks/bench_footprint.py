"""What a specproxy container needs: the installed size of its wheel set and the `specproxy
serve` process's memory (RSS) at idle and under load, with its CPU per request. The Kubernetes
requests in deploy/kubernetes/base/deployment.yaml are sized from these figures.

Size: builds the wheels of specproxy[postgres] as the Dockerfile's first stage does, installs
them offline into an empty target directory (no dev extra), and reports both sizes (the image
adds its python:3.12-slim base to the installed size).
Memory: starts two emulated arms (`specproxy emulate`) and the real `specproxy serve` (SQLite
store, scraper, and its stats process, `specproxy stats --follow`; GC settings as in
production) on loopback, reads VmRSS after `--idle` seconds, then drives `--connections`
closed-loop clients for `--load` seconds (the stats process computes every 15 s over the growing
store) and reads VmRSS and the peak VmHWM, of the proxy and of its stats process apart.

    flock /tmp/heavy.lock .venv/bin/python benchmarks/bench_footprint.py [--skip-size]
        [--idle 20] [--load 90] [--connections 32] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parents[1]


def du_mib(path: Path) -> float:
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    return total / 2**20


def measure_size(work: Path) -> None:
    wheels, target = work / "wheels", work / "site"
    pip = [sys.executable, "-m", "pip", "-q", "--disable-pip-version-check"]
    subprocess.run(
        [*pip, "wheel", "--wheel-dir", str(wheels), f"{REPO}[postgres]"], check=True, cwd=work
    )
    version = next(wheels.glob("specproxy-*.whl")).name.split("-")[1]
    subprocess.run(
        [*pip, "install", "--no-index", "--find-links", str(wheels), "--target", str(target),
         f"specproxy[postgres]=={version}"],
        check=True,
    )  # fmt: skip
    print(f"wheel set: {len(list(wheels.glob('*.whl')))} wheels, {du_mib(wheels):.1f} MiB")
    print(f"installed (pip install --target, no dev extra): {du_mib(target):.1f} MiB")
    biggest = sorted(((du_mib(p), p.name) for p in target.iterdir() if p.is_dir()), reverse=True)[
        :6
    ]
    print("largest packages: " + ", ".join(f"{name} {mib:.0f} MiB" for mib, name in biggest))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) // 1024  # MiB
    return fields


def cpu_seconds(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def stats_processes(pid: int) -> list[int]:
    """The proxy's stats process(es): its children running `specproxy stats --follow`."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    children = [int(c) for c in path.read_text().split()] if path.exists() else []
    return [c for c in children if b"--follow" in Path(f"/proc/{c}/cmdline").read_bytes()]


async def wait_ok(url: str, deadline_s: float = 60) -> None:
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            try:
                async with session.get(url) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{url} not ready")


async def load(url: str, connections: int, seconds: float, max_tokens: int) -> tuple[int, int]:
    body = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": max_tokens}
    ok = failed = 0
    end = time.monotonic() + seconds

    async def client(session: aiohttp.ClientSession, stream: bool) -> None:
        nonlocal ok, failed
        while time.monotonic() < end:
            async with session.post(url, json={**body, "stream": stream}) as resp:
                await resp.read()
                if resp.status == 200:
                    ok += 1
                else:
                    failed += 1

    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(client(session, i % 2 == 0) for i in range(connections)))
    return ok, failed


def start_stack(work: Path) -> tuple[list[subprocess.Popen[bytes]], str]:
    """Two emulated arms and `specproxy serve` on free loopback ports; the proxy last."""
    ports = {name: free_port() for name in ("baseline", "speculative", "proxy")}
    program = [sys.executable, "-m", "specproxy"]
    emulate = [*program, "emulate", "--served-model-name", "m", "--enable-per-request-metrics"]
    spec = ["--speculative-config", '{"method":"ngram","num_speculative_tokens":4}']
    processes = [
        subprocess.Popen([*emulate, "--port", str(ports["baseline"])]),
        subprocess.Popen([*emulate, *spec, "--port", str(ports["speculative"])]),
        subprocess.Popen(
            [*program, "serve", "--port", str(ports["proxy"]),
             "--store", f"sqlite:///{work}/p.db",
             "--baseline", f"http://127.0.0.1:{ports['baseline']}",
             "--speculative", f"http://127.0.0.1:{ports['speculative']}"],
            cwd=work,
        ),
    ]  # fmt: skip
    return processes, f"http://127.0.0.1:{ports['proxy']}"


async def measure_memory(
    pid: int, base: str, idle: float, seconds: float, conns: int, tokens: int
) -> None:
    await wait_ok(base + "/readyz")
    await asyncio.sleep(idle)
    stats = stats_processes(pid)
    print(
        f"idle after {idle:.0f} s: RSS {status(pid)['VmRSS']} MiB"
        + "".join(f", stats process RSS {status(s)['VmRSS']} MiB" for s in stats)
    )
    cpu0 = cpu_seconds(pid)
    stats_cpu0 = {s: cpu_seconds(s) for s in stats}
    ok, failed = await load(base + "/v1/chat/completions", conns, seconds, tokens)
    cpu = cpu_seconds(pid) - cpu0
    mem = status(pid)
    for s in stats:
        used, smem = cpu_seconds(s) - stats_cpu0[s], status(s)
        print(
            f"stats process (pid {s}, {seconds:.0f} s of load): CPU {used:.1f} s, RSS "
            f"{smem['VmRSS']} MiB, peak {smem['VmHWM']} MiB"
        )
    print(
        f"under load ({conns} connections, {seconds:.0f} s, half streaming, max_tokens "
        f"{tokens}): {ok} ok / {failed} failed, {ok / seconds:.0f} req/s, proxy CPU "
        f"{cpu:.1f} s ({ok / max(cpu, 1e-9):.0f} req per CPU-second), RSS {mem['VmRSS']} MiB, "
        f"peak {mem['VmHWM']} MiB"
    )
    async with aiohttp.ClientSession() as session, session.get(base + "/api/stats") as resp:
        print(f"stats result served: {resp.status == 200}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-size", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--idle", type=float, default=20.0)
    parser.add_argument("--load", type=float, default=90.0)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=16)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="specproxy-footprint-"))
    try:
        if not args.skip_size:
            measure_size(work)
        if not args.skip_memory:
            processes, base = start_stack(work)
            pid = processes[-1].pid
            try:
                asyncio.run(
                    measure_memory(
                        pid, base, args.idle, args.load, args.connections, args.max_tokens
                    )
                )
            finally:
                for process in processes:
                    process.terminate()
                for process in processes:
                    process.wait(timeout=90)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
