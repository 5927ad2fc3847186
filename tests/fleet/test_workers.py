"""`serve --workers N`: one port, one /metrics view, workers die with the parent (SIGKILL too)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from pathlib import Path

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from specproxy.emulator.config import EmulatorConfig
from specproxy.emulator.server import run_emulator
from specproxy.fleet.workers import worker_argv

REPO = Path(__file__).resolve().parents[2]
REQUESTS = 40


def test_worker_argv_drops_the_workers_flag() -> None:
    argv = ["serve", "--workers", "2", "--port", "8000", "--workers=3", "--store", "memory://"]
    assert worker_argv(argv) == ["serve", "--port", "8000", "--store", "memory://"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.split(") ", 1)[1][0] != "Z"  # a zombie has exited


def worker_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_text().split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


async def local_requests(pid: int) -> float:
    """One worker's own count, read from its private socket (named in its environment)."""
    environ = worker_environ(pid)
    sock = (
        Path(environ["SPECPROXY_WORKER_DIR"]) / f"worker-{environ['SPECPROXY_WORKER_INDEX']}.sock"
    )
    async with (
        aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=str(sock))) as session,
        session.get("http://worker/metrics", params={"local": "1"}) as resp,
    ):
        return requests_total(await resp.text())


def requests_total(text: str) -> float:
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "specproxy_requests_total"
    )


async def test_two_workers_one_port_one_view_and_no_orphans() -> None:
    emulator = EmulatorConfig(warmup_requests=0, default_output_tokens=4, time_scale=0.1)
    async with (
        run_emulator(emulator) as base,
        run_emulator(EmulatorConfig(speculative=True, warmup_requests=0, time_scale=0.1)) as spec,
    ):
        port = _free_port()
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "specproxy",
            "serve",
            "--workers",
            "2",
            "--port",
            str(port),
            "--baseline",
            base,
            "--speculative",
            spec,
            "--store",
            "memory://",
            cwd=REPO,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        workers: list[int] = []
        try:
            connector = aiohttp.TCPConnector(force_close=True)  # a new connection each time
            async with aiohttp.ClientSession(connector=connector) as session:
                for _ in range(600):
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get(url + "/healthz") as resp:
                            if resp.status == 200 and len(children(proc.pid)) == 2:
                                break
                    await asyncio.sleep(0.1)
                workers = children(proc.pid)
                assert len(workers) == 2
                body = {"model": "tiny-llama", "prompt": "hello", "max_tokens": 4}
                for _ in range(REQUESTS):
                    async with session.post(url + "/v1/completions", json=body) as resp:
                        assert resp.status == 200
                        await resp.read()
                # Whichever worker answers the scrape, it counts every worker's requests.
                for _ in range(6):
                    async with session.get(url + "/metrics") as resp:
                        assert requests_total(await resp.text()) == REQUESTS
                own = [await local_requests(w) for w in workers]
                assert sum(own) == REQUESTS  # each worker's own share adds up to the merged view
            os.kill(proc.pid, signal.SIGKILL)  # no cleanup code runs in the parent
            await proc.wait()
            for _ in range(200):
                if not any(alive(w) for w in workers):
                    break
                await asyncio.sleep(0.05)
            assert not any(alive(w) for w in workers), "a worker outlived its parent"
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            for w in workers:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(w, signal.SIGKILL)


def stats_processes(pids: list[int]) -> list[int]:
    """Those of `pids` that run `specproxy stats --follow`."""
    found = []
    for pid in pids:
        with contextlib.suppress(OSError):
            if b"--follow" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
                found.append(pid)
    return found


async def test_workers_share_one_stats_process_started_by_their_parent(tmp_path: Path) -> None:
    """With a SQLite store and `compute = "child"`, the parent starts exactly one stats process
    (no worker starts its own: they run as "external"); every worker serves its results; it
    dies with the parent."""
    port = _free_port()
    dead = "http://127.0.0.1:9"  # the arms need not answer for the statistics
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "serve", "--workers", "2", "--port", str(port),
        "--baseline", dead, "--speculative", dead, "--store", f"sqlite:///{tmp_path}/s.db",
        cwd=tmp_path,
        env={**os.environ, "SPECPROXY_STATS__INTERVAL_S": "0.5"},
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    everyone: list[int] = []
    try:
        for _ in range(1200):  # a slow machine only takes longer
            kids = children(proc.pid)
            started = [k for k in kids if "SPECPROXY_WORKER_INDEX" in worker_environ(k)]
            if len(kids) == 3 and stats_processes(kids) and len(started) == 2:  # all exec'ed
                break
            await asyncio.sleep(0.1)
        kids = children(proc.pid)
        [stats] = stats_processes(kids)
        workers = [k for k in kids if k != stats]
        assert len(workers) == 2
        for worker in workers:
            assert worker_environ(worker)["SPECPROXY_STATS__COMPUTE"] == "external"
            assert not stats_processes(children(worker))  # no worker has a child of its own
        connector = aiohttp.TCPConnector(force_close=True)  # a new connection each time
        async with aiohttp.ClientSession(connector=connector) as session:
            answers = 0
            for _ in range(1200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/api/stats") as resp:
                        answers = answers + 1 if resp.status == 200 else 0
                if answers >= 6:  # several in a row: whichever worker answered has it
                    break
                await asyncio.sleep(0.1)
            assert answers >= 6
        assert stats_processes(children(proc.pid)) == [stats]  # still the one
        everyone = [*kids, *(c for k in kids for c in children(k))]
        os.kill(proc.pid, signal.SIGKILL)  # no cleanup code runs in the parent
        await proc.wait()
        for _ in range(600):
            if not any(alive(p) for p in everyone):
                break
            await asyncio.sleep(0.05)
        assert not any(alive(p) for p in everyone), "a process outlived its parent"
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        for p in everyone:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
