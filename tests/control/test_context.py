"""Replicas sharing one store: a change through one is applied by all within one poll, stored
once; a restarted replica keeps a stop; every `serve --workers N` worker applies a change."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
from pytest_aiohttp import AiohttpClient

from specproxy.appkeys import CONTROL, ROUTER, STORE
from tests.control.cutline import CutLine
from tests.control.test_api import control_app, control_config
from tests.fleet.test_workers import REPO, _free_port, children, worker_environ
from tests.test_app import closed_url

# Generous: a bound on a hung test, never an assertion about how fast anything is.
WAIT_S = 120.0


async def test_a_weight_change_through_one_replica_is_applied_by_both(
    aiohttp_client: AiohttpClient, pg_url: str, tmp_path: Path
) -> None:
    # poll_s of an hour: the test drives the one poll that the bound allows, explicitly.
    first = control_app(control_config(tmp_path / "a", url=pg_url, poll_s=3600))
    second = control_app(control_config(tmp_path / "b", url=pg_url, poll_s=3600))
    client = await aiohttp_client(first)
    await aiohttp_client(second)
    resp = await client.post(
        "/api/arms/speculative", json={"action": "set", "weight": 0.2, "why": "canary"}
    )
    assert resp.status == 200
    event = (await resp.json())["event"]
    assert first[ROUTER].share == 0.2  # the replica that took it: at once
    assert second[ROUTER].share == 0.5  # the other: not before its next poll ...
    assert await second[CONTROL].poll()  # ... which is the one poll interval of the bound
    assert second[ROUTER].share == 0.2
    assert second[CONTROL].state.last_id == event["id"]
    for app in (first, second):
        assert await app[CONTROL].poll()  # polling again adds nothing
        stored = await app[STORE].arm_events(run_id="run")
        assert [(e.id, e.action, e.weight, e.why) for e in stored] == [
            (event["id"], "set", 0.2, "canary")
        ]  # stored once, whoever reads it
        assert app[ROUTER].share == 0.2


async def test_a_replica_cut_off_from_the_store_keeps_its_last_known_weights(
    aiohttp_client: AiohttpClient, pg_url: str, tmp_path: Path
) -> None:
    async with CutLine(pg_url) as line:
        first = control_app(control_config(tmp_path / "a", url=pg_url, poll_s=3600))
        second = control_app(control_config(tmp_path / "b", url=line.url, poll_s=3600))
        client = await aiohttp_client(first)
        client_b = await aiohttp_client(second)
        await client.post("/api/arms/speculative", json={"action": "set", "weight": 0.2})
        assert await second[CONTROL].poll() and second[ROUTER].share == 0.2
        line.cut()  # the second replica loses its store; the first still reaches it
        resp = await client.post("/api/arms/speculative", json={"action": "set", "weight": 0.9})
        assert resp.status == 200 and first[ROUTER].share == 0.9
        assert not await second[CONTROL].poll()  # cannot read the store ...
        assert not await second[CONTROL].poll()
        assert second[ROUTER].share == 0.2  # ... so it keeps the last weight it knew (not 0.5)
        assert second[CONTROL].poll_failures == 2
        view = await (await client_b.get("/api/arms")).json()
        assert view["arms"][0]["share"] == 0.2 and view["last_event_id"] == 1
        # A change through the cut-off replica cannot be stored: refused, applied nowhere.
        resp = await client_b.post("/api/experiment", json={"action": "stop"})
        assert resp.status == 503 and not second[CONTROL].state.stopped
        line.mend()
        assert await second[CONTROL].poll()  # back: it catches up with the change it missed
        assert second[ROUTER].share == 0.9 and not second[CONTROL].state.stopped
        stored = await first[STORE].arm_events(run_id="run")
        assert [(e.action, e.weight) for e in stored] == [("set", 0.2), ("set", 0.9)]


async def test_the_poller_applies_a_change_made_elsewhere(
    aiohttp_client: AiohttpClient, pg_url: str, tmp_path: Path
) -> None:
    first = control_app(control_config(tmp_path / "a", url=pg_url, poll_s=0.05))
    second = control_app(control_config(tmp_path / "b", url=pg_url, poll_s=0.05))
    client = await aiohttp_client(first)
    await aiohttp_client(second)
    resp = await client.post("/api/experiment", json={"action": "stop", "why": "p99 alert"})
    event_id = (await resp.json())["event"]["id"]
    await asyncio.wait_for(second[CONTROL].wait_applied(event_id), WAIT_S)  # its own poll loop
    assert second[CONTROL].state.stopped and second[ROUTER].share == 0.0


async def test_a_restarted_replica_keeps_a_stop(
    aiohttp_client: AiohttpClient, pg_url: str, tmp_path: Path
) -> None:
    cfg = control_config(tmp_path, url=pg_url, poll_s=3600)
    before = control_app(cfg)
    client = await aiohttp_client(before)
    await client.post("/api/arms/speculative", json={"action": "set", "weight": 0.7})
    await client.post("/api/experiment", json={"action": "stop"})
    await client.close()  # the replica goes away ...
    after = control_app(cfg)
    await aiohttp_client(after)  # ... and starts again, folding every stored event of the run
    assert after[CONTROL].state.stopped and after[ROUTER].share == 0.0
    assert after[CONTROL].state.weights["speculative"] == 0.7
    assert [e.action for e in after[CONTROL].recent] == ["set", "stop"]


async def test_every_worker_applies_a_change(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "SPECPROXY_CONTROL__POLL_S": "0.1",
        "SPECPROXY_STATS__COMPUTE": "external",  # no stats process: not what this test is about
    }
    upstream = closed_url()
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "specproxy", "serve", "--workers", "2", "--port", str(port)),
        *("--baseline", upstream, "--speculative", upstream, "--run-id", "run"),
        *("--store", f"sqlite:///{tmp_path}/store.db"),
        cwd=REPO,
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(1200):
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(url + "/healthz") as resp:
                        if resp.status == 200 and len(children(proc.pid)) == 2:
                            break
                await asyncio.sleep(0.1)
            workers = children(proc.pid)
            assert len(workers) == 2
            async with session.post(url + "/api/experiment", json={"action": "stop"}) as resp:
                assert resp.status == 200  # taken by one worker, through the shared port
        for pid in workers:  # each worker's own answer, on its private socket
            environ = worker_environ(pid)
            index = environ["SPECPROXY_WORKER_INDEX"]
            sock = Path(environ["SPECPROXY_WORKER_DIR"]) / f"worker-{index}.sock"
            connector = aiohttp.UnixConnector(path=str(sock))
            view: dict[str, Any] = {}
            async with aiohttp.ClientSession(connector=connector) as session:
                for _ in range(int(WAIT_S / 0.1)):
                    # a worker may not listen on its socket yet: the shared port answered first
                    with contextlib.suppress(aiohttp.ClientError):
                        async with session.get("http://worker/api/arms") as resp:
                            view = await resp.json()
                    if view.get("stopped"):
                        break
                    await asyncio.sleep(0.1)
            assert view.get("stopped") and view["arms"][0]["share"] == 0.0, pid
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), 60)
            except TimeoutError:
                proc.kill()
                await proc.wait()
