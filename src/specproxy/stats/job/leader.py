"""Which replica runs the stats job: one leader per run, elected through the store.

Several proxies (replicas, or the workers of `serve --workers N`) share one store. The
stats job is expensive and its result must be one answer, so one process computes it and writes
each result to the store's history; the others serve the latest stored result.

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) on a dedicated connection,
  keyed by the run id. PostgreSQL releases it when that session ends, so when the leader dies
  (even SIGKILL: the kernel closes its socket) the next replica that asks gets it, within one
  stats interval. A leader re-checks its connection every interval and steps down if it broke.
- SQLite: an exclusive `flock` on a file next to the database, which the kernel releases when
  the process dies. SQLite is a single-host store, so this elects one leader among the workers of
  one host; several replicas on several hosts need PostgreSQL.
- `memory://` has one process by definition: always the leader.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
from typing import Any, Protocol
from urllib.parse import urlsplit

from specproxy.store.sqlite import sqlite_path

__all__ = ["AlwaysLeader", "FileLockLeader", "Leadership", "PgAdvisoryLeader", "leadership_for"]

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0


class Leadership(Protocol):
    """Asked once per stats interval whether this process is (now) the leader."""

    async def is_leader(self) -> bool: ...

    async def close(self) -> None: ...


class AlwaysLeader:
    """A store only this process uses."""

    async def is_leader(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def lock_key(run_id: str) -> int:
    """A stable signed 64-bit advisory-lock key for the run's stats leader."""
    digest = hashlib.blake2b(f"specproxy-stats-leader:{run_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


class PgAdvisoryLeader:
    """Leader while this process holds the run's advisory lock in its own PostgreSQL session."""

    def __init__(self, dsn: str, run_id: str) -> None:
        self._dsn = dsn
        self._key = lock_key(run_id)
        self._conn: Any = None  # asyncpg.Connection
        self._held = False

    async def is_leader(self) -> bool:
        import asyncpg

        try:
            if self._conn is None or self._conn.is_closed():
                self._held = False
                self._conn = await asyncpg.connect(self._dsn, timeout=CONNECT_TIMEOUT_S)
            if self._held:
                # The lock lives as long as the session: a working session still holds it.
                await self._conn.fetchval("SELECT 1", timeout=CONNECT_TIMEOUT_S)
            else:
                self._held = bool(
                    await self._conn.fetchval(
                        "SELECT pg_try_advisory_lock($1)", self._key, timeout=CONNECT_TIMEOUT_S
                    )
                )
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            if self._held:
                log.warning("stats leader: lost the PostgreSQL session, stepping down: %s", exc)
            await self._drop()
        return self._held

    async def close(self) -> None:
        await self._drop()

    async def _drop(self) -> None:
        conn, self._conn, self._held = self._conn, None, False
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close(timeout=CONNECT_TIMEOUT_S)  # ends the session: frees the lock


class FileLockLeader:
    """Leader while this process holds an exclusive flock on `path`."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._fd: int | None = None

    async def is_leader(self) -> bool:
        if self._fd is not None:
            return True
        fd = os.open(self._path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    async def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor releases the lock


def leadership_for(store_url: str, run_id: str) -> Leadership:
    """The election that fits the store: advisory lock, file lock, or none needed."""
    scheme = urlsplit(store_url).scheme
    if scheme in ("postgresql", "postgres"):
        return PgAdvisoryLeader(store_url, run_id)
    if scheme == "sqlite":
        path, _ = sqlite_path(store_url)
        return FileLockLeader(f"{path}.stats-leader-{lock_key(run_id) & 0xFFFFFFFF:08x}")
    return AlwaysLeader()
