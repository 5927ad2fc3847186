"""`specproxy stats` (`stats.cli`): compute once from a store, as JSON and as text, with the
settings stored with the run's latest result, the proxy's config file, or flags."""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from specproxy.cli import main
from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.records import Arm, GpuSample, RequestRecord
from specproxy.scrape.dcgm import combine_readings, parse_dcgm
from specproxy.stats.job.runner import StatsJob
from tests.stats.job.runs import RUN
from tests.stats.job.runs import records as _records


async def _store_run(
    db: str, gpu: list[GpuSample] | None = None, t0: float = 1000.0, rollups: str = "inline"
) -> None:
    """A SQLite store at `db` holding 400 records of run RUN (t t0 to t0 + 40 s) and `gpu`,
    written with `rollups` as a proxy's `store.rollups`."""
    from specproxy.store.factory import open_store

    cfg = StoreConfig(url=f"sqlite:///{db}", rollups=rollups)  # type: ignore[arg-type]
    s = open_store(cfg, run_id=RUN)
    await s.start()
    for rec in _records(400, t0, 1.5, 1):
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


def test_an_unknown_run_id_exits_2_and_lists_the_runs(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28 item 5: `stats --run-id nosuchrun` printed empty windows and exited 0."""
    db = f"{tmp_path}/s.db"
    asyncio.run(_store_run(db))
    assert main(["stats", "--store", f"sqlite:///{db}", "--run-id", "nosuchrun"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"specproxy: error: no run 'nosuchrun' in sqlite:///{db}; its runs: {RUN}"]


def test_the_text_report_prints_times_as_utc_iso_8601(
    tmp_path: object, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 28 item 5: the window end printed as Unix seconds."""
    import datetime

    db = f"{tmp_path}/s.db"
    asyncio.run(_store_run(db))
    assert main(["stats", "--store", f"sqlite:///{db}", "--json", "--resamples", "200"]) == 0
    end = json.loads(capsys.readouterr().out)["window_end"]
    assert main(["stats", "--store", f"sqlite:///{db}", "--resamples", "200"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    iso = datetime.datetime.fromtimestamp(end, datetime.UTC).isoformat(timespec="seconds")
    assert first == f"run {RUN}: windows end at {iso.replace('+00:00', 'Z')}"


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
            ("derived_h200_hot_saturated.prom", "speculative"),
            ("derived_h200_cool.prom", "baseline"),
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


def _slower_p99_records(n: int = 8000) -> list[RequestRecord]:
    """Every speculative latency 10 % above the baseline's distribution, over ~67 minutes: its
    anytime-valid P99 test says slower at p99_tolerance 0, inconclusive at 0.05."""
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        arm = "speculative" if i % 2 else "baseline"
        e2e = float(rng.lognormal(0.0, 0.3)) * (1.1 if arm == "speculative" else 1.0)
        out.append(
            RequestRecord(
                request_id=f"q{i}",
                run_id=RUN,
                arm=arm,
                t_start=1000.0 + i * 0.5,
                model="m",
                endpoint="chat.completions",
                stream=True,
                status=200,
                e2e_s=e2e,
                upstream_s=e2e,
                ttft_s=e2e / 5,
                tpot_s=e2e / 100,
                prompt_tokens=20,
                output_tokens=100,
            )
        )
    return out


LIVE = StatsConfig(
    windows_s=(3600.0, None),
    p99_tolerance=0.0,
    alpha=0.04,
    resamples=200,
    seed=7,
)


async def _live_tick(db: str) -> dict[str, Any]:
    """What a proxy served with `LIVE` computed and stored (the stats process's `run_once`)."""
    from specproxy.store.factory import open_store

    store = open_store(StoreConfig(url=f"sqlite:///{db}"), run_id=RUN)
    await store.start()
    for rec in _slower_p99_records():
        store.record(rec)
    await store.flush()
    job = StatsJob(
        store,
        run_id=RUN,
        stats_cfg=LIVE,
        warmup=WarmupConfig(requests=0),
        clock=lambda: 1000.0 + 8000 * 0.5,
    )
    result = await job.run_once()
    await job.close()
    await store.close()
    return cast(dict[str, Any], result)


def _p99(result: dict[str, Any]) -> str:
    verdict: str = result["results"]["all"]["all"]["metrics"]["e2e"]["sequential"]["p99"]["verdict"]
    return verdict


def test_once_reproduces_the_live_verdict_with_the_stored_settings(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The defect: a proxy served with p99_tolerance = 0 said slower live, and `specproxy stats`
    on the same store said inconclusive at the default 0.05."""
    db = str(tmp_path / "s.db")
    live = asyncio.run(_live_tick(db))
    assert _p99(live) == "slower"
    assert main(["stats", "--store", f"sqlite:///{db}", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["settings"] == live["settings"]  # tolerance, alpha, resamples, seed, warm-up
    assert list(out["results"]["all"]) == ["1h", "all"]  # the windows it compared
    assert _p99(out) == "slower"
    # same rows, same settings: the same estimates and verdicts (the bootstrap's draws also
    # depend on the other windows, whose end the live tick took from its clock)
    for metric, block in live["results"]["all"]["all"]["metrics"].items():
        once = out["results"]["all"]["all"]["metrics"][metric]
        assert once["verdict"] == block["verdict"], metric
        for stat, ci in block["speedup"].items():
            assert once["speedup"][stat]["estimate"] == ci["estimate"], (metric, stat)
    # the config's settings instead (here the defaults): what it said before
    assert main(["stats", "--store", f"sqlite:///{db}", "--json", "--settings", "config"]) == 0
    own = json.loads(capsys.readouterr().out)
    assert own["settings"]["p99_tolerance"] == 0.05 and _p99(own) == "inconclusive"
    # a flag wins over the stored settings
    flags = ["--json", "--p99-tolerance", "0.05", "--resamples", "300"]
    assert main(["stats", "--store", f"sqlite:///{db}", *flags]) == 0
    flagged = json.loads(capsys.readouterr().out)
    assert flagged["settings"]["p99_tolerance"] == 0.05 and flagged["settings"]["resamples"] == 300
    assert flagged["settings"]["alpha"] == LIVE.alpha  # the rest stays stored


def test_once_honours_the_proxys_config_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "s.db"
    asyncio.run(_store_run(str(db)))  # records only, no stored result: the config's settings
    config = tmp_path / "specproxy.toml"
    config.write_text(
        'baseline_url = "http://127.0.0.1:9"\nspeculative_url = "http://127.0.0.1:9"\n'
        f'run_id = "{RUN}"\n[store]\nurl = "sqlite:///{db}"\n'
        '[stats]\nresamples = 250\nwindows_s = ["all"]\nalpha = 0.02\n'
    )
    monkeypatch.setenv("SPECPROXY_STATS__SEED", "11")  # the environment applies as for serve
    assert main(["stats", "--config", str(config), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_id"] == RUN and list(out["results"]["all"]) == ["all"]
    settings = out["settings"]
    assert (settings["resamples"], settings["alpha"], settings["seed"]) == (250, 0.02, 11)
    assert main(["stats", "--config", str(config), "--json", "--alpha", "0.03"]) == 0
    assert json.loads(capsys.readouterr().out)["settings"]["alpha"] == 0.03
    bad = tmp_path / "bad.toml"
    bad.write_text(config.read_text().replace("alpha = 0.02", "alpha = 0.9"))
    assert main(["stats", "--config", str(bad)]) == 2
    assert "stats.alpha" in capsys.readouterr().err


# ---- A/B/n: a run whose arms are named ---------------------------------------------------------

THREE_ARMS_TOML = """
run_id = "abn3"
[arms.base]
role = "control"
urls = ["http://127.0.0.1:1"]
[arms.ngram-k4]
urls = ["http://127.0.0.1:2"]
[arms.eagle]
urls = ["http://127.0.0.1:3"]
"""


async def _store_named_arms(db: str, *, with_result: bool = False) -> None:
    """tests.report.abn's three-arm run (control "base"), 150 requests per arm; with the stats
    job's result stored too when `with_result` (what a proxy with `[arms.NAME]` leaves)."""
    from specproxy.store.factory import open_store
    from tests.report import abn

    store = open_store(StoreConfig(url=f"sqlite:///{db}"), run_id=abn.RUN)
    await store.start()
    try:
        for rec in abn.records(per_arm=150):
            store.record(rec)
        await store.flush()
        if with_result:
            await abn.store_stats(store, StatsConfig(resamples=200))
    finally:
        await store.close()


def _arms_of(out: str) -> tuple[str, list[str], dict[str, int]]:
    window = json.loads(out)["results"]["all"]["all"]
    return window["control"], window["treatments"], window["samples"]


def test_a_run_with_named_arms_is_refused_until_its_control_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bench or ingest run with named arms and no stored result: compared with a 'baseline'
    that holds no data, every comparison was empty and the text report raised KeyError."""
    db = f"{tmp_path}/named.db"
    asyncio.run(_store_named_arms(db))
    store = ["--store", f"sqlite:///{db}", "--resamples", "200", "--warmup-requests", "0"]
    assert main(["stats", *store]) == 2
    err = capsys.readouterr().err
    assert "the run's arms are base, eagle, ngram-k4 and none is the control 'baseline'" in err
    assert "--control NAME" in err

    assert main(["stats", *store, "--control", "base", "--json"]) == 0
    control, treatments, samples = _arms_of(capsys.readouterr().out)
    assert (control, treatments) == ("base", ["eagle", "ngram-k4"])  # every other arm, by name
    assert samples == {"base": 150, "eagle": 150}  # the first treatment's, as two arms read

    config = tmp_path / "three.toml"
    config.write_text(THREE_ARMS_TOML)
    assert main(["stats", *store, "--config", str(config), "--json"]) == 0
    control, treatments, _ = _arms_of(capsys.readouterr().out)
    assert (control, treatments) == ("base", ["ngram-k4", "eagle"])  # the config's, in order

    assert main(["stats", *store, "--config", str(config)]) == 0
    text = capsys.readouterr().out
    for treatment in ("ngram-k4", "eagle"):
        assert f"[all / all] split: base n=150, {treatment} n=150" in text
    assert "2 treatments against base: each verdict at alpha 0.025 (bonferroni" in text
    assert "best: " in text or "no winner yet" in text


def test_the_arms_of_the_runs_stored_result_are_compared_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = f"{tmp_path}/stored.db"
    asyncio.run(_store_named_arms(db, with_result=True))
    assert main(["stats", "--store", f"sqlite:///{db}", "--json"]) == 0
    control, treatments, _ = _arms_of(capsys.readouterr().out)
    assert (control, treatments) == ("base", ["ngram-k4", "eagle"])
    with pytest.raises(SystemExit):  # an arm name is checked like the config's
        main(["stats", "--store", f"sqlite:///{db}", "--control", "Base"])
