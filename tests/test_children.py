"""Helper processes die with the proxy: a SIGKILLed `specproxy serve` leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from tests.proctree import descendants, wait_gone


def test_a_child_whose_parent_is_already_gone_exits_at_once() -> None:
    code = "from specproxy.children import die_with_parent; die_with_parent(1); print('alive')"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "alive" not in done.stdout, done.stderr


def test_a_child_with_its_parent_keeps_running() -> None:
    code = (
        "import os; from specproxy.children import die_with_parent; "
        "die_with_parent(os.getppid()); print('alive')"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == "alive", done.stderr


def test_sigkill_of_serve_leaves_no_child_process(tmp_path: Path) -> None:
    dead = "http://127.0.0.1:9"  # nothing listens: the proxy starts anyway (/readyz says 503)
    cmd = [sys.executable, "-m", "specproxy", "serve", "--baseline", dead, "--speculative", dead]
    cmd += ["--port", "0", "--store", f"sqlite:///{tmp_path}/store.db"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # serve starts its stats process (`stats --follow`): wait until it stored its first
        # result, the moment a reader process used to start (slow machines only take longer)
        deadline = time.monotonic() + 120
        while not _stats_written(tmp_path / "store.db") and time.monotonic() < deadline:
            assert proc.poll() is None
            time.sleep(0.1)
        assert _stats_written(tmp_path / "store.db"), "no stats result in time"
        children = descendants(proc.pid)
        # the stats process, and nothing else: reads use sqlite3 (no ADBC reader, no tracker)
        assert {pid for pid, _ in children} == set(_stats_process(proc.pid)), children
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    survivors = wait_gone(children, timeout_s=30)
    for pid, _ in survivors:  # a failing run must not leave them behind either
        os.kill(pid, signal.SIGKILL)
    assert not survivors, f"orphans after SIGKILL: {sorted(survivors)}"


def _stats_written(db: Path) -> bool:
    """Whether the stats process's first result is in the store."""
    if not db.exists():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
            return bool(conn.execute("SELECT COUNT(*) FROM stats_history").fetchone()[0])
    except sqlite3.Error:  # not migrated yet
        return False


def _stats_process(pid: int) -> list[int]:
    found = []
    for child, _ in descendants(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--follow" in argv:
            found.append(child)
    return found
