"""`specproxy stats` (`stats.cli`): compute once from a store, as JSON and as text."""

from __future__ import annotations

import asyncio
import json
import math
import os

import pytest

from specproxy.cli import main
from specproxy.config import StoreConfig
from tests.stats.test_job import RUN, _records


def test_cli_computes_once(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("specproxy.store.sqlite")
    db = f"{tmp_path}/s.db"

    async def fill() -> None:
        from specproxy.store.factory import open_store

        s = open_store(StoreConfig(url=f"sqlite:///{db}"), run_id=RUN)
        await s.start()
        for rec in _records(400, 1000.0, 1.5, 1):
            s.record(rec)
        await s.close()

    asyncio.run(fill())
    assert main(["stats", "--store", f"sqlite:///{db}", "--json", "--resamples", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_id"] == RUN
    assert main(["stats", "--store", f"sqlite:///{db}", "--resamples", "200"]) == 0
    text = capsys.readouterr().out
    assert "tpot" in text
    # each metric's P99 verdict names the test behind it and the e-values against the boundary
    p99 = out["results"]["all"]["all"]["metrics"]["tpot"]["sequential"]["p99"]
    by = " + ".join(p99["decided_by"]) or "no test"
    faster = p99["exceedance_faster"]["statistic"]  # split traffic: the exceedance test
    shown = "n/a" if faster is None else f"{faster:.2f}"
    assert f"P99 {p99['verdict']} ({by}); per-minute exceedance slower log e " in text
    assert f"faster log e {shown} / {math.log(2 / 0.05):.2f}" in text


def test_cli_rejects_a_bad_setting_before_touching_the_store(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"{tmp_path}/never.db"
    assert main(["stats", "--store", f"sqlite:///{db}", "--resamples", "5"]) == 2
    assert "stats.resamples must be >= 100" in capsys.readouterr().err
    assert not os.path.exists(db)
