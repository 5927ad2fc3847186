"""Several OS processes: replicas sharing PostgreSQL, and SIGTERM in the middle of a load."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from pathlib import Path

import pytest

from specproxy.store import open_store
from tests.store.conftest import store_config, writer_process


def _final(proc: subprocess.Popen[str]) -> tuple[int, int]:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    last = out.strip().splitlines()[-1].split()
    assert last[0] == "final", out
    return int(last[1]), int(last[2])


async def _ids(url: str, tmp_path: Path) -> list[str]:
    store = open_store(store_config(url, tmp_path / "reader"))
    arrays = await store.read_arrays(run_id="procs", columns=["request_id"])
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
