"""Clock faults on a shared store: rows stamped hours after now beside the run's own rows.

Two ways to get them: the clock of the host that wrote them stepped back afterwards (NTP
correcting a clock set 3 h ahead: every row before the step is now "from the future"), or a
replica whose clock runs fast writes into the same store as the others. Either way the rows
are in the store when the statistics read it; here they are written straight into a real
SQLite file (3 h ahead of the wall clock) beside normal rows, and real `specproxy stats`
processes read it: the one-off computation (whose windows used to end at the newest stamp, 3 h
ahead: every window held the future rows and lag_s was -10,8xx s) and the periodic job
(`--follow`, whose windows end at its clock: its horizon used to be now, hiding the real lag).

Every stamp is relative to the wall clock at the test's start and a window holds the normal
rows for minutes after it, so nothing depends on how fast the machine is.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from specproxy.config import StoreConfig
from specproxy.store.sqlite import SqliteStore
from tests.stats.job.runs import RUN, records

pytestmark = pytest.mark.timeout(300)

NORMAL = 600  # rows per test, arms alternating: 300 a arm, 0.1 s apart
AHEAD_S = 3 * 3600.0  # the fast replica's (or the stepped-back clock's) lead
AGO_S = 100.0  # the normal rows start this long before the test (and end 40 s later)
SKEW_S = 5.0  # stats.future_skew_s by default
WINDOWS = ("5m", "1h", "all")


async def _write_store(db: Path) -> tuple[float, float]:
    """Normal rows from now - AGO_S, as many rows from now + AHEAD_S (other request ids): the
    newest normal stamp and the newest future stamp."""
    store = SqliteStore(StoreConfig(url=f"sqlite:///{db}"), run_id=RUN)
    await store.start()
    now = time.time()
    normal = records(NORMAL, now - AGO_S, 1.5, 0)
    future = [
        dataclasses.replace(r, request_id=f"fast-{r.request_id}")
        for r in records(NORMAL, now + AHEAD_S, 1.5, 1)
    ]
    for rec in (*normal, *future):
        store.record(rec)
    await store.flush()
    await store.close()
    return max(r.t_start for r in normal), max(r.t_start for r in future)


def _config(tmp_path: Path, db: Path) -> Path:
    path = tmp_path / "stats.toml"
    path.write_text(
        f'run_id = "{RUN}"\n'
        f'[store]\nurl = "sqlite:///{db}"\n'
        '[stats]\ninterval_s = 0.5\nresamples = 200\nwindows_s = [300, 3600, "all"]\n'
        "[warmup]\nrequests = 5\n"
    )
    return path


def _check(result: dict[str, Any], newest_normal: float, newest_future: float) -> None:
    """No window holds a future row, the lag is the normal rows' age, the future rows counted."""
    computed_at = float(result["computed_at"])
    assert result["window_end"] <= computed_at + SKEW_S, result["window_end"] - computed_at
    assert result["data_horizon"] == pytest.approx(newest_normal, abs=1e-3)
    lag = result["lag_s"]
    assert lag is not None and lag >= 0.0
    assert lag == pytest.approx(computed_at - newest_normal, abs=1e-3)
    assert result["future_rows"] == NORMAL  # usable, primary, 3 h ahead
    assert result["future_newest"] == pytest.approx(newest_future, abs=1e-3)
    per_arm = NORMAL // 2
    for label in WINDOWS:
        window = result["results"]["all"][label]
        assert window["span"][1] <= computed_at + SKEW_S + window["unit_s"], (label, window["span"])
        for arm, n in window["samples"].items():
            # every normal row of the arm, less its warm-up: no future row in any window
            assert n + window["excluded_warmup"][arm] == per_arm, (label, arm, n)


def _follow(config: Path, log: Path) -> subprocess.Popen[bytes]:
    """A `specproxy stats --follow` process (the periodic job), its stderr in `log`."""
    with open(log, "wb") as err:
        return subprocess.Popen(
            [sys.executable, "-m", "specproxy", "stats", "--follow", "--config", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


async def test_the_one_off_computation_leaves_future_rows_out(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    newest_normal, newest_future = await _write_store(db)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specproxy",
        "stats",
        "--config",
        str(_config(tmp_path, db)),
        "--settings",
        "config",
        "--json",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    assert proc.returncode == 0, err.decode()
    _check(json.loads(out), newest_normal, newest_future)
    # the warning names the run, the count, the allowance and how far ahead the newest is
    said = err.decode()
    assert f"{NORMAL} usable requests of run {RUN}" in said and f"{SKEW_S:g} s" in said
    ahead = re.search(r"the newest (\d+) s ahead", said)
    assert ahead is not None and abs(float(ahead.group(1)) - AHEAD_S) < 600, said


async def test_the_periodic_job_leaves_future_rows_out_and_reports_them(tmp_path: Path) -> None:
    db = tmp_path / "store.db"
    newest_normal, newest_future = await _write_store(db)
    log = tmp_path / "follow.log"
    proc = _follow(_config(tmp_path, db), log)
    try:
        reader = SqliteStore(StoreConfig(url=f"sqlite:///{db}"), run_id=RUN)
        await reader.start(read_only=True)
        try:
            newest = None
            for _ in range(2400):  # a slow machine only takes longer
                assert proc.poll() is None, log.read_text()
                newest = await reader.latest_stats(run_id=RUN)
                if newest is not None:
                    break
                await asyncio.sleep(0.1)
            assert newest is not None, log.read_text()
        finally:
            await reader.close()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 120) == 0, log.read_text()
    _check(newest[1], newest_normal, newest_future)
    assert "stamped more than" in log.read_text()
