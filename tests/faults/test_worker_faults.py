"""`serve --workers N` under faults: any worker SIGKILLed is noticed and the pod stops (no
zombie, no silent N-1 workers whose merged counters dropped), and with `protect_metrics = true`
every scrape still merges every worker's page (the sibling fetch carries the admin token)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path

import aiohttp
import pytest

from tests.faults.conftest import RUN, fault_row
from tests.faults.serve_proc import Serve
from tests.faults.upstream import FaultUpstream
from tests.proctree import descendants, wait_gone
from tests.proxy.conftest import CHAT, chat

pytestmark = pytest.mark.timeout(300)

WORKERS = 3
TOKEN = "t" * 32


def _toml(upstream: FaultUpstream, extra: str = "") -> str:
    return f"""{extra}
baseline_url = "{upstream.url}"
speculative_url = "{upstream.url}"
run_id = "{RUN}"
[store]
url = "memory://"
"""


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def _worker_dir(pid: int) -> Path:
    raw = Path(f"/proc/{pid}/environ").read_text().split("\0")
    env = dict(item.split("=", 1) for item in raw if "=" in item)
    return Path(env["SPECPROXY_WORKER_DIR"])


async def _all_workers_up(serve: Serve, workers: int) -> list[int]:
    """Until the parent has `workers` children and each listens on its private socket."""
    for _ in range(1200):
        assert serve.proc.poll() is None, serve.log.read_text()
        kids = _children(serve.pid)
        if len(kids) == workers:
            with contextlib.suppress(FileNotFoundError, KeyError):
                if len(list(_worker_dir(kids[0]).glob("worker-*.sock"))) == workers:
                    return kids
        await asyncio.sleep(0.1)
    raise AssertionError(serve.log.read_text())


async def _send(serve: Serve, n: int) -> None:
    connector = aiohttp.TCPConnector(force_close=True)  # new connections: every worker gets some
    async with aiohttp.ClientSession(connector=connector) as session:
        for _ in range(n):
            async with session.post(serve.url + CHAT, json=chat(), headers={"x-fault": "ok"}) as r:
                assert r.status == 200
                await r.read()


async def test_sigkill_of_any_worker_stops_the_pod(faulty: FaultUpstream, tmp_path: Path) -> None:
    serve = Serve(tmp_path, _toml(faulty), args=["--workers", str(WORKERS)])
    await serve.ready()
    kids = await _all_workers_up(serve, WORKERS)
    rss_before = sum(_rss(pid) for pid in kids)
    await _send(serve, 30)
    rss_after = sum(_rss(pid) for pid in kids)
    tree = descendants(serve.pid)
    os.kill(kids[-1], signal.SIGKILL)  # not the first: the old loop only looked at the first
    try:
        status = await serve.wait(timeout_s=90)  # main's parent ran on with N-1 workers forever
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()  # its workers die with it (die_with_parent)
    assert status != 0
    assert not wait_gone(tree, timeout_s=30)  # the others were stopped, and none is a zombie
    assert "exited with status" in serve.log.read_text()
    fault_row("SIGKILL of the last of 3 workers", "30 x 200, then the pod exits",
              "memory store", 0, rss_before, rss_after)  # fmt: skip


async def test_protected_metrics_merge_every_worker(faulty: FaultUpstream, tmp_path: Path) -> None:
    serve = Serve(
        tmp_path,
        _toml(faulty, "protect_metrics = true"),
        args=["--workers", "2"],
        env={"SPECPROXY_ADMIN_TOKEN": TOKEN},
    )
    try:
        await serve.ready()
        kids = await _all_workers_up(serve, 2)
        rss_before = sum(_rss(pid) for pid in kids)
        sent = 40
        await _send(serve, sent)
        auth = {"Authorization": f"Bearer {TOKEN}"}
        seen = set()
        for _ in range(10):  # whichever worker answers, it counts both workers' requests
            seen.add(await serve.metric("specproxy_requests_total", headers=auth))
        assert seen == {sent}
        rss_after = sum(_rss(pid) for pid in kids)
    finally:
        serve.proc.send_signal(signal.SIGTERM)
        assert await serve.wait() == 0
    fault_row("protect_metrics + --workers 2", f"{sent} x 200", "every scrape counts all",
              0, rss_before, rss_after)  # fmt: skip


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")
