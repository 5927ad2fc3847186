"""`specproxy stats` (`stats.cli`): compute once from a store, as JSON and as text."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path

import pytest

from specproxy.cli import main
from specproxy.config import StoreConfig
from specproxy.records import Arm, GpuSample
from specproxy.scrape.dcgm import combine_readings, parse_dcgm
from tests.stats.job.runs import RUN
from tests.stats.job.runs import records as _records


async def _store_run(db: str, gpu: list[GpuSample] | None = None) -> None:
    """A SQLite store at `db` holding 400 records of run RUN (t 1000-1040 s) and `gpu`."""
    from specproxy.store.factory import open_store

    s = open_store(StoreConfig(url=f"sqlite:///{db}"), run_id=RUN)
    await s.start()
    for rec in _records(400, 1000.0, 1.5, 1):
        s.record(rec)
    for sample in gpu or []:
        s.record_gpu(sample)
    await s.close()


def test_cli_computes_once(tmp_path: object, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("specproxy.store.sqlite")
    db = f"{tmp_path}/s.db"
    asyncio.run(_store_run(db))
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


DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"


def _gpu_sample(page: str, t: float, arm: Arm) -> GpuSample:
    readings = parse_dcgm((DCGM / page).read_text(encoding="utf-8"))
    return combine_readings(t, arm, readings, run_id=RUN)


@pytest.mark.parametrize("with_gpu", [True, False], ids=["gpu-stored", "no-exporters"])
def test_cli_diagnoses_the_gpu_samples_the_store_holds(
    tmp_path: object, capsys: pytest.CaptureFixture[str], with_gpu: bool
) -> None:
    # `specproxy stats` runs in a process that never scraped a GPU: the GPU branches come from
    # the stored samples alone (the derived hot H200 page for the speculative arm: DRAM active
    # 0.95, sw_thermal|hw_thermal; the cool one for the baseline). Without any stored sample (no
    # exporters configured) both branches stay "not evaluated", never "no GPU metrics".
    db = f"{tmp_path}/gpu.db"
    gpu = [
        _gpu_sample(page, t, arm)
        for t in (1000.0, 1015.0, 1030.0, 1039.0)
        for page, arm in (
            ("derived_h200_hot_saturated.prom", Arm.SPECULATIVE),
            ("derived_h200_cool.prom", Arm.BASELINE),
        )
    ]
    asyncio.run(_store_run(db, gpu if with_gpu else []))
    assert main(["stats", "--store", f"sqlite:///{db}", "--json", "--resamples", "200"]) == 0
    out = json.loads(capsys.readouterr().out)
    window = out["results"]["all"]["all"]
    codes = {r["code"] for r in window["diagnosis"]["reasons"]}
    skipped = {r["code"] for r in window["diagnosis"].get("not_evaluated", [])}
    assert "no_gpu_metrics" not in codes
    gpu_codes = {"memory_bandwidth_saturated", "thermal_throttling"}
    if with_gpu:
        spec = window["engine"]["speculative"]["gpu"]
        assert spec["samples"] == 4 and spec["thermal_throttle_share"] == 1.0
        assert spec["memory_bandwidth"] == pytest.approx(0.953112)
        assert window["engine"]["baseline"]["gpu"]["memory_bandwidth"] == pytest.approx(0.41)
        assert gpu_codes <= codes and not skipped & gpu_codes
        messages = [r["message"] for r in window["diagnosis"]["reasons"] if r["code"] in gpu_codes]
        assert all("speculative" in m and "baseline" not in m for m in messages)
    else:
        assert window["engine"]["speculative"]["gpu"] is None
        assert not codes & gpu_codes and skipped == gpu_codes
