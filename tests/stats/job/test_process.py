"""`specproxy stats --follow` (`stats.job.process`), as a real process: it computes from the
proxy's config and store, stores each result, and exits cleanly on SIGTERM; and the served-model
labels it keys per-model results by."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiohttp import web
from pytest_aiohttp import AiohttpServer

from specproxy.cli import main
from specproxy.config import Config
from specproxy.fleet.models import OTHER
from specproxy.stats.job.process import ServedModels
from tests.stats.job.runs import RUN
from tests.stats.test_cli import _store_run

FOLLOW_CONFIG = """
baseline_url = "http://127.0.0.1:9"
speculative_url = "http://127.0.0.1:9"
run_id = "{run}"
[store]
url = "sqlite:///{db}"
spill_path = "{dir}/spill.jsonl"
[stats]
interval_s = 0.5
resamples = 200
p99_tolerance = 0.0
"""


def history(db: Path) -> list[dict[str, object]]:
    if not db.exists():
        return []
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            rows = conn.execute("SELECT result FROM stats_history ORDER BY t").fetchall()
        except sqlite3.OperationalError:  # the schema is not there yet
            return []
    return [json.loads(body) for (body,) in rows]


def pending_and_rolled_up(db: Path) -> tuple[int, int, int]:
    """Request rows still pending (deferred rollups), the e2e rollups' requests, and the rows
    the rollups take (usable primary requests, `summary.minute.usable_for_rollup`)."""
    usable = (
        "SELECT count(*) FROM requests WHERE status = 200 AND error_kind IS NULL AND "
        "disconnected = 0 AND rerouted_from IS NULL AND shadow = 0 AND e2e_s > 0"
    )
    with sqlite3.connect(db, timeout=30) as conn:
        pending = conn.execute("SELECT count(*) FROM requests WHERE rollup_pending = 1")
        rolled = conn.execute("SELECT sum(n) FROM rollup_minutes WHERE metric = 'e2e'")
        return (
            int(pending.fetchone()[0]),
            int(rolled.fetchone()[0] or 0),
            int(conn.execute(usable).fetchone()[0]),
        )


def test_follow_computes_every_interval_and_exits_cleanly_on_sigterm(tmp_path: Path) -> None:
    """It also rolls up the rows proxies wrote with deferred rollups, before its first tick."""
    db = tmp_path / "store.db"
    # Recent rows: the live job's windows end now, so rows from 1970 (`_store_run`'s default)
    # made its whole-run window 56 years of minutes, and each tick took minutes, not the test.
    asyncio.run(_store_run(str(db), t0=time.time() - 60, rollups="deferred"))
    pending, rolled, usable = pending_and_rolled_up(db)
    assert (pending, rolled) == (400, 0) and usable > 0
    config = tmp_path / "specproxy.toml"
    config.write_text(FOLLOW_CONFIG.format(run=RUN, db=db, dir=tmp_path))
    log = tmp_path / "follow.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "specproxy", "stats", "--follow", "--config", str(config)],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )
    try:
        # a slow or loaded machine only takes longer: the bound is pytest's 300 s per test, less
        # the shutdown's own allowance
        deadline = time.monotonic() + 220
        while len(history(db)) < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    results = history(db)
    assert all(r["run_id"] == RUN for r in results)
    settings = results[-1]["settings"]
    assert isinstance(settings, dict)
    assert settings["p99_tolerance"] == 0.0 and settings["resamples"] == 200  # the config's
    window = results[-1]["results"]["all"]["all"]  # type: ignore[index]
    assert sum(window["samples"].values()) > 0
    assert "Traceback" not in log.read_text()
    assert pending_and_rolled_up(db) == (0, usable, usable)


async def test_the_served_models_bound_the_model_label(aiohttp_server: AiohttpServer) -> None:
    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "tiny-llama"}]})

    app = web.Application()
    app.router.add_get("/v1/models", models)
    arm = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    dead = "http://127.0.0.1:9"
    cfg = Config.from_mapping(
        {"speculative": {"urls": [dead, arm]}, "baseline_url": dead, "model_allow": ["mine"]}
    )
    served = ServedModels(cfg, interval_s=3600)
    await served.start()  # the first refresh: the dead endpoint, then the next one that answers
    try:
        assert served.label("tiny-llama") == "tiny-llama"
        assert served.label("mine") == "mine"
        assert served.label("made-up") == OTHER
    finally:
        await served.close()


def test_follow_refuses_a_store_no_other_process_can_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["stats", "--follow", "--store", "memory://"]) == 2
    assert "a memory:// store lives in one process" in capsys.readouterr().err
