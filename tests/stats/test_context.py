"""The statistics wired into the proxy app: on memory:// the job runs inside (traffic in,
/api/stats and the speedup gauges out); on a shared store the proxy only follows what a stats
process stored, and never loads the statistics."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import STATS_JOB
from specproxy.config import ArmConfig, Config, ScrapeConfig, StatsConfig, StoreConfig, WarmupConfig
from specproxy.emulator import EmulatorConfig, run_emulator
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.stats import context
from specproxy.stats.job.supervisor import StatsChild
from specproxy.store.factory import open_store
from tests.fake_openai import FakeOpenAI
from tests.proctree import descendants
from tests.scrape.fakes import FakeMetricsServer

DCGM = Path(__file__).resolve().parents[1] / "fixtures" / "dcgm-exporter"


@pytest.fixture
async def proxy() -> AsyncIterator[
    tuple[TestClient[web.Request, web.Application], CollectorRegistry]
]:
    fast = {"base_step_s": 0.002, "warmup_requests": 0, "seed": 1}
    async with (
        run_emulator(EmulatorConfig(speculative=True, **fast)) as spec_url,  # type: ignore[arg-type]
        run_emulator(EmulatorConfig(**fast)) as base_url,  # type: ignore[arg-type]
    ):
        cfg = Config(
            baseline_url=base_url,
            speculative_url=spec_url,
            store=StoreConfig(url="memory://", flush_interval_s=0.05),
            scrape=ScrapeConfig(interval_s=0.2),
            stats=StatsConfig(interval_s=0.2, resamples=200),
            warmup=WarmupConfig(requests=0),
        )
        registry = CollectorRegistry()
        client: TestClient[web.Request, web.Application] = TestClient(
            TestServer(create_app(cfg, registry=registry))
        )
        await client.start_server()
        try:
            yield client, registry
        finally:
            await client.close()


async def test_api_stats_reflects_recorded_traffic(
    proxy: tuple[TestClient[web.Request, web.Application], CollectorRegistry],
) -> None:
    client, registry = proxy
    body = {"model": "tiny-llama", "prompt": "count to ten", "max_tokens": 24}
    for _ in range(30):
        resp = await client.post("/v1/completions", json=body)
        assert resp.status == 200
        await resp.read()

    async with asyncio.timeout(30):
        while True:
            resp = await client.get("/api/stats")
            if resp.status == 200:
                result = await resp.json()
                window = result["results"]["all"]["all"]
                if sum(window["samples"].values()) >= 30:
                    break
            await asyncio.sleep(0.1)

    assert window["samples"]["speculative"] + window["samples"]["baseline"] == 30
    speedup = window["metrics"]["e2e"]["speedup"]["median"]
    assert speedup["status"] == "ok"
    assert speedup["lower"] <= speedup["estimate"] <= speedup["upper"]
    gauge = registry.get_sample_value(
        "specproxy_speedup_ratio",
        {
            "model": "all",
            "window": "all",
            "arm": "speculative",
            "metric": "e2e",
            "statistic": "median",
            "bound": "estimate",
        },
    )
    assert gauge is not None and gauge > 0


async def test_the_inline_job_carries_the_configured_arm_labels() -> None:
    """A/B/n: `[arms.NAME] labels` reach the result (`arm_labels`), which /ui and the report
    show beside each arm; arms without labels are left out."""
    arms = {
        "base": {"role": "control", "urls": ["http://127.0.0.1:9"]},
        "ngram-k2": {"urls": ["http://127.0.0.1:9"], "labels": {"method": "ngram", "k": 2}},
        "eagle": {"urls": ["http://127.0.0.1:9"], "labels": {"method": "eagle"}},
    }
    cfg = Config.from_mapping(
        {"arms": arms, "store": {"url": "memory://"}, "stats": {"interval_s": 3600.0}}
    )
    app = create_app(cfg, registry=CollectorRegistry())
    async with TestClient(TestServer(app)):
        result = await app[STATS_JOB].run_once()
    assert result.get("arm_labels") == {
        "ngram-k2": {"method": "ngram", "k": "2"},
        "eagle": {"method": "eagle"},
    }


async def test_no_store_means_no_job_and_a_clear_503() -> None:
    cfg = Config(baseline_url="http://127.0.0.1:9", speculative_url="http://127.0.0.1:9")
    app = create_app(cfg, recorder=MemoryRecorder(), with_store=False, with_stats=False)
    async with TestClient(TestServer(app)) as client:
        resp = await client.get("/api/stats")
        assert resp.status == 503
        error = (await resp.json())["error"]
        assert error["code"] == 503 and "not running" in error["message"]


async def test_gpu_telemetry_of_an_arm_reaches_api_stats(aiohttp_server: AiohttpServer) -> None:
    # The whole path inside the app: a fake dcgm-exporter on port 0 (derived hot page: DRAM
    # active 0.95, reasons sw_thermal|hw_thermal) for the speculative arm, the GPU scraper, the
    # stats job's window summary and diagnosis, served at /api/stats.
    exporter = FakeMetricsServer(body=(DCGM / "derived_h200_hot_saturated.prom").read_text())
    exporter_url = str((await aiohttp_server(exporter.app())).make_url(""))
    fast = {"base_step_s": 0.002, "warmup_requests": 0, "seed": 1}
    async with (
        run_emulator(EmulatorConfig(speculative=True, **fast)) as spec_url,  # type: ignore[arg-type]
        run_emulator(EmulatorConfig(**fast)) as base_url,  # type: ignore[arg-type]
    ):
        cfg = Config(
            baseline_url=base_url,
            speculative=ArmConfig(urls=(spec_url,), dcgm_urls=(exporter_url,)),
            store=StoreConfig(url="memory://", flush_interval_s=0.05),
            scrape=ScrapeConfig(interval_s=0.1),
            stats=StatsConfig(interval_s=0.2, resamples=200),
            warmup=WarmupConfig(requests=0),
        )
        async with TestClient(TestServer(create_app(cfg))) as client:
            body = {"model": "tiny-llama", "prompt": "count to ten", "max_tokens": 8}
            for _ in range(10):
                resp = await client.post("/v1/completions", json=body)
                assert resp.status == 200
                await resp.read()
            async with asyncio.timeout(30):
                while True:
                    resp = await client.get("/api/stats")
                    if resp.status == 200:
                        window = (await resp.json())["results"]["all"]["all"]
                        gpu = window["engine"]["speculative"].get("gpu")
                        if gpu is not None and gpu["up_samples"] >= 2:
                            break
                    await asyncio.sleep(0.1)
    assert gpu["memory_bandwidth"] == pytest.approx(0.953112)
    assert window["engine"]["baseline"]["gpu"] is None
    codes = {r["code"] for r in window["diagnosis"]["reasons"]}
    assert {"memory_bandwidth_saturated", "thermal_throttling"} <= codes


# ---- a proxy on a shared store: it follows, it does not compute ------------------------------

REPO = Path(__file__).resolve().parents[2]


def _proxy_imports(tmp_path: Path, compute: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tests.stats.proxy_imports", f"sqlite:///{tmp_path}/s.db", compute,
         str(tmp_path / "spill.jsonl")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    assert report["statuses"]["chat 200"] == 40 and report["statuses"]["/metrics"] == 200
    return report


@pytest.mark.parametrize("compute", ["external", "child"])
def test_the_proxy_process_never_loads_numpy_or_scipy(tmp_path: Path, compute: str) -> None:
    """Nothing of the statistics loads in a proxy whose store is shared, whether it starts a
    stats process or not: the write path (records, summaries, the store) is numpy-free. With the
    statistics inside the proxy (before `stats.job.process`), stats.* imported both."""
    report = _proxy_imports(tmp_path, compute)
    # nor OpenTelemetry, with traces off (the default): `proxy.tracing` imports it only when on
    assert not report["loaded"]["opentelemetry"], report["imports"]
    assert not report["loaded"]["scipy"], report["imports"]
    assert not report["loaded"]["numpy"], report["imports"]
    assert report["imports"] == []


async def test_an_external_stats_process_result_is_served_and_nothing_starts(
    tmp_path: Path,
) -> None:
    cfg = Config(
        baseline_url="http://127.0.0.1:9",
        speculative_url="http://127.0.0.1:9",
        run_id="ext",
        store=StoreConfig(url=f"sqlite:///{tmp_path}/s.db", spill_path=f"{tmp_path}/spill"),
        stats=StatsConfig(interval_s=0.1, compute="external"),
    )
    registry = CollectorRegistry()
    app = create_app(cfg, registry=registry)
    async with TestClient(TestServer(app)) as client:
        assert STATS_JOB not in app and not _follow_processes()
        resp = await client.get("/api/stats")
        assert resp.status == 503 and "no statistics yet" in await resp.text()
        # what an external `specproxy stats --follow` writes into the shared store
        other = open_store(cfg.store, run_id="ext")
        await other.start()
        now = time.time()
        stored: dict[str, Any] = {"computed_at": now, "run_id": "ext", "results": {}}
        await other.write_stats(run_id="ext", t=now, result=stored)
        await other.close()
        for _ in range(3000):  # a slow machine only takes longer
            resp = await client.get("/api/stats")
            if resp.status == 200:
                break
            await asyncio.sleep(0.02)
        assert await resp.json() == stored
        assert registry.get_sample_value("specproxy_stats_leader") == 0.0  # it does not compute
        last = registry.get_sample_value("specproxy_stats_last_run_timestamp_seconds")
        assert last == stored["computed_at"]


async def test_the_proxy_answers_while_its_stats_process_keeps_crashing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, aiohttp_server: AiohttpServer
) -> None:
    monkeypatch.setenv("FAKE_CHILD_OUT", str(tmp_path))
    monkeypatch.setenv("FAKE_CHILD_MODE", "crash")
    fake = Path(__file__).parent / "job" / "fake_stats_child.py"
    monkeypatch.setattr(
        context, "StatsChild", functools.partial(StatsChild, program=(sys.executable, str(fake)))
    )
    upstream = str((await aiohttp_server(FakeOpenAI(model="m").app())).make_url("")).rstrip("/")
    cfg = Config(
        baseline_url=upstream,
        speculative_url=upstream,
        store=StoreConfig(url=f"sqlite:///{tmp_path}/s.db", spill_path=f"{tmp_path}/spill"),
    )
    registry = CollectorRegistry()
    async with TestClient(TestServer(create_app(cfg, registry=registry))) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        for _ in range(200):  # until the stats process crashed at least twice
            resp = await client.post("/v1/chat/completions", json=body)
            assert resp.status == 200
            await resp.read()
            if _starts(tmp_path) >= 2:
                break
            await asyncio.sleep(0.05)
        assert _starts(tmp_path) >= 2  # started again after its crash
        assert (await client.get("/healthz")).status == 200
        assert (await client.get("/api/stats")).status == 503  # no result: said, not failed
        assert registry.get_sample_value("specproxy_stats_leader") is None  # unknown


def _starts(out: Path) -> int:
    """How many times the stand-in stats process started (one record each)."""
    return len(list(out.glob("*.json")))


def _follow_processes() -> list[int]:
    return [
        pid
        for pid, _ in descendants(os.getpid())
        if b"--follow" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    ]
