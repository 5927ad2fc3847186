"""Several OS processes: replicas sharing PostgreSQL, and SIGTERM in the middle of a load."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import ClientSession, web
from pytest_aiohttp import AiohttpServer

from specproxy.store.factory import open_store
from tests.store.conftest import store_config, writer_process
from tests.store.helpers import read_arrays


def _final(proc: subprocess.Popen[str]) -> tuple[int, int]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    last = out.strip().splitlines()[-1].split()
    assert last[0] == "final", out
    return int(last[1]), int(last[2])


async def _ids(url: str, tmp_path: Path) -> list[str]:
    store = open_store(store_config(url, tmp_path / "reader"))
    arrays = await read_arrays(store, run_id="procs", columns=["request_id"])
    await store.close()
    return [i for a in arrays.values() for i in a["request_id"]]


async def test_two_writer_processes_share_postgres_exactly_once(
    pg_url: str, tmp_path: Path
) -> None:
    n = 3000
    procs = [writer_process(pg_url, f"p{i}", tmp_path / f"spill{i}.jsonl", n) for i in range(2)]
    finals = await asyncio.gather(*(asyncio.to_thread(_final, p) for p in procs))
    assert finals == [(n, 0), (n, 0)]
    ids = await _ids(pg_url, tmp_path)
    assert len(ids) == 2 * n
    assert set(ids) == {f"p{i}-{k}" for i in range(2) for k in range(n)}


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
async def test_sigterm_during_load_loses_no_record(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path}/store.db"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    proc = writer_process(url, "term", tmp_path / "spill.jsonl", None)
    assert proc.stdout is not None
    acked = 0
    deadline = time.monotonic() + 60
    while acked < 2000 and time.monotonic() < deadline:  # wait until it is well under way
        line = await asyncio.to_thread(proc.stdout.readline)
        if line.startswith("ack"):
            acked = int(line.split()[1])
    assert acked >= 2000
    proc.send_signal(signal.SIGTERM)
    final, dropped = _final(proc)
    assert final >= acked and dropped == 0
    ids = await _ids(url, tmp_path)
    assert len(ids) == final == len(set(ids))
    assert not _nonempty_spills(tmp_path)


def _nonempty_spills(folder: Path) -> list[Path]:
    return [p for p in folder.glob("spill.jsonl*") if p.stat().st_size]


async def _fake_upstream(request: web.Request) -> web.Response:
    body = await request.json()
    return web.json_response(
        {
            "id": "cmpl-1",
            "object": "text_completion",
            "model": body.get("model", "tiny"),
            "choices": [{"index": 0, "text": "hi", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5},
        }
    )


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _start_proxy(upstream: str, port: int, store: str, workdir: Path) -> subprocess.Popen[str]:
    workdir.mkdir()  # each replica spills into its own directory
    cmd = [sys.executable, "-m", "specproxy", "serve", "--baseline", upstream]
    cmd += ["--speculative", upstream, "--port", str(port), "--store", store, "--run-id", "procs"]
    return subprocess.Popen(cmd, cwd=workdir, stderr=subprocess.PIPE, text=True)


async def test_two_proxy_processes_record_every_request_once(
    pg_url: str, tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    upstream_app = web.Application()
    upstream_app.router.add_post("/v1/completions", _fake_upstream)
    upstream = await aiohttp_server(upstream_app)
    up_url = str(upstream.make_url("")).rstrip("/")
    ports = [_free_port(), _free_port()]
    procs = [
        _start_proxy(up_url, port, pg_url, tmp_path / f"proxy{i}") for i, port in enumerate(ports)
    ]
    n = 150
    try:
        async with ClientSession() as client:
            for port in ports:
                for _ in range(200):  # wait until the replica listens
                    try:
                        async with client.get(f"http://127.0.0.1:{port}/healthz") as resp:
                            if resp.status == 200:
                                break
                    except OSError:
                        pass
                    await asyncio.sleep(0.1)

            async def send(port: int) -> None:
                for _ in range(n):
                    url = f"http://127.0.0.1:{port}/v1/completions"
                    async with client.post(url, json={"model": "tiny", "prompt": "x"}) as resp:
                        assert resp.status == 200
                        await resp.read()

            await asyncio.gather(*(send(port) for port in ports))
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            _, err = await asyncio.to_thread(proc.communicate, timeout=60)
            assert proc.returncode == 0, err
    ids = await _ids(pg_url, tmp_path)
    assert len(ids) == 2 * n == len(set(ids))
