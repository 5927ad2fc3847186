"""serve's stats process (`stats.job.supervisor.StatsChild`), driven with a stand-in program
(`fake_stats_child.py`): what it is started with, its leadership reports, restarts with backoff
after a crash, and a stop that ends in SIGKILL when SIGTERM is not enough; then a real
`specproxy serve` with its real stats process: the proxy serves the child's results, keeps
answering while the child is down, starts another, and stops it on exit."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from pytest_aiohttp import AiohttpServer

from specproxy.config import Config, StatsConfig, StoreConfig
from specproxy.stats.job.settings import CHILD_CONFIG_ENV, child_settings
from specproxy.stats.job.supervisor import (
    BLAS_VARIABLES,
    NICENESS,
    RESTART_MIN_S,
    STABLE_S,
    StatsChild,
    child_environment,
    needs_stats_process,
)
from specproxy.store.factory import open_store
from tests.fake_openai import FakeOpenAI
from tests.faults.serve_proc import Serve
from tests.proctree import alive, descendants, wait_gone
from tests.proxy.conftest import CHAT, chat
from tests.stats.job.runs import RUN
from tests.stats.job.runs import records as run_records

FAKE = Path(__file__).with_name("fake_stats_child.py")


def config(url: str = "sqlite:///x.db", compute: str = "child") -> Config:
    return Config(
        baseline_url="http://127.0.0.1:9",
        speculative_url="http://127.0.0.1:9",
        run_id="r",
        store=StoreConfig(url=url),
        stats=StatsConfig(compute=compute, p99_tolerance=0.0),  # type: ignore[arg-type]
    )


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FAKE_CHILD_OUT", str(tmp_path))
    return tmp_path


def records(out: Path) -> dict[int, dict[str, Any]]:
    found = {}
    for path in out.glob("*.json"):
        try:
            found[int(path.stem)] = json.loads(path.read_text())
        except ValueError:  # being written
            continue
    return found


def wait_until(predicate: Any, child: StatsChild | None = None, timeout_s: float = 60) -> None:
    """Poll (the child too, as its owner does) until `predicate()`; a slow machine only waits."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        if child is not None:
            child.poll()
        time.sleep(0.02)


def test_only_a_shared_store_with_compute_child_needs_a_stats_process() -> None:
    assert needs_stats_process(config())
    assert needs_stats_process(config("postgresql://u@h/db"))
    assert not needs_stats_process(config(compute="external"))
    assert not needs_stats_process(config("memory://"))  # computed inside the proxy


def test_the_environment_carries_the_config_and_one_blas_thread() -> None:
    cfg = config()
    env = child_environment(cfg, {"PATH": "/bin"})
    assert Config.from_mapping(json.loads(env[CHILD_CONFIG_ENV])) == cfg
    assert child_settings(env).stats.p99_tolerance == 0.0
    assert all(env[name] == "1" for name in BLAS_VARIABLES) and env["PATH"] == "/bin"
    chosen = child_environment(cfg, {"OMP_NUM_THREADS": "4"})  # the operator's choice wins
    assert chosen["OMP_NUM_THREADS"] == "4" and "OPENBLAS_NUM_THREADS" not in chosen


async def test_started_with_its_parent_pid_and_status_pipe_then_stopped(fake: Path) -> None:
    child = StatsChild(config(), program=(sys.executable, str(FAKE)))
    child.poll()
    pid = child.pid
    assert pid is not None
    try:
        wait_until(lambda: pid in records(fake) and child.leader is True, child)
        record = records(fake)[pid]
        argv = record["argv"]
        assert argv[:4] == ["stats", "--follow", "--child-of", str(os.getpid())]
        assert record["pgid"] == pid  # its own process group: a terminal's Ctrl-C is ours
        assert Config.from_mapping(json.loads(record["env"][CHILD_CONFIG_ENV])) == config()
        assert record["env"]["OPENBLAS_NUM_THREADS"] == "1"
        proc = (pid, _start_time(pid))
    finally:
        await child.aclose()
    assert not alive(proc)
    assert child.pid is None and child.leader is None
    child.poll()
    assert child.pid is None  # stopped for good: no restart


def pid_of(child: StatsChild) -> int | None:
    """The child's pid now (a call, so that a type checker does not carry it across polls)."""
    return child.pid


def _start_time(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[19])


def test_a_crashed_child_is_restarted_with_backoff(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CHILD_MODE", "crash")
    now = [0.0]
    child = StatsChild(config(), program=(sys.executable, str(FAKE)), clock=lambda: now[0])
    child.poll()
    first = pid_of(child)
    wait_until(lambda: pid_of(child) is None, child)  # it exited, the owner noticed
    assert child.restarts == 1
    child.poll()
    assert pid_of(child) is None  # not before the backoff
    now[0] += RESTART_MIN_S
    child.poll()
    assert pid_of(child) not in (None, first)
    wait_until(lambda: pid_of(child) is None, child)
    now[0] += RESTART_MIN_S
    child.poll()
    assert pid_of(child) is None  # the second crash in a row waits twice as long
    now[0] += RESTART_MIN_S
    child.poll()
    assert pid_of(child) is not None
    now[0] += STABLE_S  # this one ran long enough: the backoff starts over
    wait_until(lambda: pid_of(child) is None, child)
    now[0] += RESTART_MIN_S
    child.poll()
    assert pid_of(child) is not None and child.restarts == 3
    child.stop()


def running_fake(fake: Path) -> tuple[StatsChild, tuple[int, int]]:
    """A started fake child once it runs, and its process (pid, start time)."""
    child = StatsChild(config(), program=(sys.executable, str(FAKE)))
    child.poll()
    pid = child.pid
    assert pid is not None
    wait_until(lambda: pid in records(fake), child)
    return child, (pid, _start_time(pid))


async def test_a_child_that_ignores_sigterm_is_killed(
    fake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_CHILD_MODE", "stubborn")
    child, proc = running_fake(fake)
    started = time.monotonic()
    await child.aclose(grace_s=0.5)
    assert not alive(proc)
    assert time.monotonic() - started >= 0.5  # SIGTERM first, SIGKILL after the grace


def test_the_blocking_stop_of_the_workers_parent(fake: Path) -> None:
    child, proc = running_fake(fake)
    child.stop()
    assert not alive(proc) and child.pid is None


def test_a_failed_start_is_logged_and_retried(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    now = [0.0]
    missing = str(tmp_path / "no-such-python")
    child = StatsChild(config(), program=(missing,), clock=lambda: now[0])
    child.poll()  # never raises into the proxy
    assert child.pid is None and "cannot start the stats process" in caplog.text
    now[0] += RESTART_MIN_S
    child.poll()
    assert caplog.text.count("cannot start the stats process") == 2


# ---- a real `specproxy serve` with its real stats process -----------------------------------


def stats_processes(pid: int) -> list[int]:
    """The `stats --follow` processes among `pid`'s descendants."""
    found = []
    for child, _ in descendants(pid):
        with contextlib.suppress(OSError):
            if b"--follow" in Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0"):
                found.append(child)
    return found


def niceness(pid: int) -> int:
    raw = Path(f"/proc/{pid}/stat").read_text()
    return int(raw[raw.rindex(")") + 2 :].split()[16])


def environ_of(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
    return dict(item.split("=", 1) for item in raw if "=" in item)


async def poll_until(probe: Any, what: str, timeout_s: float = 120) -> Any:
    """Await `probe()` until it is truthy (a slow machine only takes longer)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = await probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


SERVE_TOML = """
baseline_url = "{upstream}"
speculative_url = "{upstream}"
run_id = "{run}"
[store]
url = "sqlite:///{db}"
spill_path = "{dir}/spill.jsonl"
flush_interval_s = 0.1
[stats]
interval_s = 0.5
resamples = 200
"""


async def test_serve_starts_one_stats_process_whose_results_it_serves_and_restarts_it(
    tmp_path: Path, aiohttp_server: AiohttpServer
) -> None:
    db = tmp_path / "store.db"
    await _recent_run(str(db))
    upstream = str((await aiohttp_server(FakeOpenAI(model="tiny-llama").app())).make_url(""))
    toml = SERVE_TOML.format(upstream=upstream.rstrip("/"), run=RUN, db=db, dir=tmp_path)
    serve = Serve(tmp_path, toml)
    try:
        await serve.ready()
        [child] = await poll_until(lambda: _async(stats_processes(serve.pid)), "the child")
        nicer = niceness(serve.pid) + NICENESS  # the child lowers its priority as it starts
        assert await poll_until(lambda: _async(niceness(child) == nicer), "the child's nice")
        assert environ_of(child)["OPENBLAS_NUM_THREADS"] == "1"
        async with aiohttp.ClientSession() as session:

            async def result() -> dict[str, Any] | None:
                async with session.get(serve.url + "/api/stats") as resp:
                    return await resp.json() if resp.status == 200 else None

            first = await poll_until(result, "a result at /api/stats")
            assert first["run_id"] == RUN
            assert sum(first["results"]["all"]["all"]["samples"].values()) >= 300
            assert await poll_until(lambda: _leader(serve), "the leader gauge") == 1.0

            # The child dies; the proxy answers throughout, starts another, serves its results.
            os.kill(child, signal.SIGKILL)
            answered = 0

            async def restarted() -> list[int]:
                nonlocal answered
                async with session.post(serve.url + CHAT, json=chat(max_tokens=4)) as resp:
                    assert resp.status == 200
                    await resp.read()
                answered += 1
                return [p for p in stats_processes(serve.pid) if p != child]

            [_second] = await poll_until(restarted, "a new stats process")
            assert answered >= 1

            async def newer() -> bool:
                latest = await result()
                return latest is not None and latest["computed_at"] > first["computed_at"]

            await poll_until(newer, "a result of the new stats process")
        assert "was killed by SIGKILL" in serve.log.read_text()
        procs = descendants(serve.pid)
        os.kill(serve.pid, signal.SIGTERM)
        assert await serve.wait() == 0
        assert not wait_gone(procs, timeout_s=60)  # stopped with serve
        assert "stats process (pid" in serve.log.read_text()
    finally:
        if serve.proc.poll() is None:
            serve.proc.kill()
            serve.proc.wait()


async def _recent_run(db: str) -> None:
    """400 records of RUN from the last minute (the proxy adds its own after them)."""
    store = open_store(StoreConfig(url=f"sqlite:///{db}"), run_id=RUN)
    await store.start()
    for rec in run_records(400, time.time() - 60, 1.5, 1):
        store.record(rec)
    await store.close()


async def _async(value: Any) -> Any:
    return value


async def _leader(serve: Serve) -> float | None:
    async with aiohttp.ClientSession() as session, session.get(serve.url + "/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith("specproxy_stats_leader "):
            return float(line.split()[1])
    return None
