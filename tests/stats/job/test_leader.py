"""Stats leader election: PostgreSQL advisory lock and file lock, incl. SIGKILL of the leader."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg

from specproxy.stats.job.leader import (
    AlwaysLeader,
    FileLockLeader,
    PgAdvisoryLeader,
    leadership_for,
    lock_key,
)
from tests.store.conftest import pg_cluster, pg_url  # noqa: F401 - fixtures

REPO = Path(__file__).resolve().parents[2]

# A leader in its own process: takes the lock, says so on stdout, then waits to be killed.
_HOLDER = """
import asyncio, sys
from specproxy.stats.job.leader import leadership_for

async def main() -> None:
    leader = leadership_for(sys.argv[1], sys.argv[2])
    print("leader" if await leader.is_leader() else "follower", flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


def holder(url: str, run_id: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, url, run_id],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "leader"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


def test_lock_key_is_stable_and_per_run() -> None:
    assert lock_key("run") == lock_key("run") != lock_key("other")
    assert -(2**63) <= lock_key("run") < 2**63


async def test_one_pg_leader_per_run_and_handover_on_close(pg_url: str) -> None:  # noqa: F811
    a, b, other = (
        PgAdvisoryLeader(pg_url, "run"),
        PgAdvisoryLeader(pg_url, "run"),
        PgAdvisoryLeader(pg_url, "another-run"),
    )
    try:
        assert await a.is_leader()
        assert not await b.is_leader()
        assert await a.is_leader()  # still holds it
        assert await other.is_leader()  # a different run has its own leader
        await a.close()
        assert await b.is_leader()
        assert not await a.is_leader()
    finally:
        for leader in (a, b, other):
            await leader.close()


async def test_pg_leader_whose_session_is_killed_steps_down(pg_url: str) -> None:  # noqa: F811
    a, b = PgAdvisoryLeader(pg_url, "run"), PgAdvisoryLeader(pg_url, "run")
    try:
        assert await a.is_leader()
        conn = await asyncpg.connect(pg_url)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_locks "
                "WHERE locktype = 'advisory' AND granted"
            )
        finally:
            await conn.close()
        assert await b.is_leader()  # the lock went with the session
        assert not await a.is_leader()  # a notices and does not claim it
    finally:
        await a.close()
        await b.close()


async def test_sigkilled_pg_leader_is_replaced_at_the_next_ask(pg_url: str) -> None:  # noqa: F811
    proc = holder(pg_url, "run")
    follower = PgAdvisoryLeader(pg_url, "run")
    try:
        assert not await follower.is_leader()
    except BaseException:
        kill(proc)
        raise
    try:
        assert not await follower.is_leader()
        kill(proc)
        # PostgreSQL ends the session when the socket closes; allow it to notice.
        for _ in range(200):
            if await follower.is_leader():
                break
            await asyncio.sleep(0.05)
        assert await follower.is_leader()
    finally:
        await follower.close()


async def test_file_lock_elects_one_and_survives_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/store.db"
    proc = holder(url, "run")
    follower = leadership_for(url, "run")
    try:
        assert isinstance(follower, FileLockLeader)
        assert not await follower.is_leader()
        kill(proc)  # the kernel releases the flock with the process
        assert await follower.is_leader()
        second = leadership_for(url, "run")
        assert not await second.is_leader()
        await second.close()
    finally:
        await follower.close()


async def test_memory_store_is_always_its_own_leader() -> None:
    leader = leadership_for("memory://", "run")
    assert isinstance(leader, AlwaysLeader)
    assert await leader.is_leader()
