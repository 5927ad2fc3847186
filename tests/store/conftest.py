"""Fixtures of the store tests: records, store configs, and a real PostgreSQL cluster."""

from __future__ import annotations

import asyncio
import itertools
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from specproxy.config import StoreConfig
from specproxy.records import Arm, RequestRecord
from specproxy.store.buffered import BufferedStore
from specproxy.store.factory import open_store
from tests.conftest import require_binary
from tests.store.pgcluster import PgCluster, find_pg_bin

REPO = Path(__file__).resolve().parents[2]
_db_names = itertools.count()


def make_record(
    i: int, *, run_id: str = "run", arm: Arm | None = None, **extra: object
) -> RequestRecord:
    values: dict[str, object] = {
        "request_id": f"req-{i}",
        "run_id": run_id,
        "arm": arm if arm is not None else ("speculative" if i % 2 else "baseline"),
        "t_start": 1_700_000_000.0 + i,
        "model": "tiny",
        "endpoint": "completions",
        "stream": True,
        "status": 200,
        "e2e_s": 1.0 + i / 1000,
        "upstream_s": 0.9,
    }
    values.update(extra)
    return RequestRecord(**values)  # type: ignore[arg-type]


def store_config(url: str, tmp_path: Path, **overrides: object) -> StoreConfig:
    values: dict[str, object] = {
        "url": url,
        "spill_path": str(tmp_path / "spill" / "spill.jsonl"),
        "flush_interval_s": 0.1,
        "batch_size": 100,
    }
    values.update(overrides)
    return StoreConfig(**values)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PgCluster]:
    initdb = require_binary("initdb", *(p for p in [find_pg_bin("initdb")] if p))
    cluster = PgCluster(initdb)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def pg_url(pg_cluster: PgCluster) -> str:
    """A fresh empty database on the shared cluster."""
    return pg_cluster.create_database(f"test_{next(_db_names)}")


@pytest.fixture
def own_pg_cluster() -> Iterator[PgCluster]:
    """A cluster of its own, for tests that stop it."""
    initdb = require_binary("initdb", *(p for p in [find_pg_bin("initdb")] if p))
    cluster = PgCluster(initdb)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.close()


def _backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/store.db"
    if request.param == "memory":
        return "memory://"
    url: str = request.getfixturevalue("pg_url")
    return url


@pytest.fixture(params=["sqlite", "postgresql", "memory"])
def backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every backend of `store.registry`: the `Store` contract tests run against each."""
    return _backend_url(request, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def durable_backend_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The backends whose rows outlive the store object (memory:// dies with it)."""
    return _backend_url(request, tmp_path)


@pytest.fixture
async def store(backend_url: str, tmp_path: Path) -> AsyncIterator[BufferedStore]:
    st = open_store(store_config(backend_url, tmp_path), run_id="run")
    await st.start()
    yield st
    await st.close()
    assert st.dropped == 0


def writer_process(url: str, prefix: str, spill: Path, count: int | None) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "tests.store.writer_proc", url, "--prefix", prefix]
    cmd += ["--spill", str(spill)]
    if count is not None:
        cmd += ["--count", str(count)]
    return subprocess.Popen(
        cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


async def eventually(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Poll `predicate` until it holds (background flushes take a moment); fail after timeout."""
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    assert predicate(), "condition not reached in time"
