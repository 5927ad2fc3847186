"""A run the job tests share: 1,600 alternating requests 0.1 s apart over two models, a 502, a
404 for a model nobody serves, and a speculative engine that restarts at t = 1050."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pytest_aiohttp import AiohttpServer

from specproxy.config import ArmConfig, Config, StatsConfig, WarmupConfig
from specproxy.records import RequestRecord
from tests.scrape.fakes import FakeMetricsServer

RUN = "r1"
DCGM = Path(__file__).resolve().parents[2] / "fixtures" / "dcgm-exporter"


def records(n: int, t0: float, speedup: float, seed: int) -> list[RequestRecord]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        arm = "speculative" if i % 2 else "baseline"
        tokens = int(rng.integers(20, 200))
        tpot = rng.lognormal(np.log(0.02), 0.2) / (speedup if arm == "speculative" else 1.0)
        ttft = rng.lognormal(np.log(0.1), 0.2)
        out.append(
            RequestRecord(
                request_id=f"q{i}",
                run_id=RUN,
                arm=arm,
                t_start=t0 + i * 0.1,
                model="m-a" if i % 4 < 2 else "m-b",
                endpoint="chat.completions",
                stream=True,
                status=200,
                e2e_s=ttft + tpot * (tokens - 1),
                upstream_s=ttft + tpot * (tokens - 1),
                ttft_s=ttft,
                tpot_s=tpot,
                prompt_tokens=50,
                output_tokens=tokens,
            )
        )
    return out


async def hot_gpu_config(aiohttp_server: AiohttpServer) -> Config:
    """A config whose speculative arm has a fake dcgm-exporter (port 0) serving the derived hot
    page: GPU 0 at DRAM active 0.95 with reasons sw_thermal|hw_thermal; the baseline has none."""
    exporter = FakeMetricsServer(body=(DCGM / "derived_h200_hot_saturated.prom").read_text())
    url = str((await aiohttp_server(exporter.app())).make_url(""))
    return Config(
        speculative=ArmConfig(urls=("http://127.0.0.1:1",), dcgm_urls=(url,)),
        baseline_url="http://127.0.0.1:2",
        run_id=RUN,
    )


def typo_404() -> RequestRecord:
    """A request for a model nobody serves (a 404 the proxy still records)."""
    return RequestRecord(
        "typo", RUN, "baseline", 1002.0, "no-such-model", "completions", False, 404, 0.01, 0.01
    )


CFG = StatsConfig(windows_s=(60.0, None), resamples=200)
WARMUP = WarmupConfig(requests=5, restart_requests=20, restart_seconds=0.0)


T0 = 60_000.0  # minute 1000


def minute_records(
    minutes: int, per_minute: int, seed: int = 0, run_id: str = RUN
) -> list[RequestRecord]:
    """`per_minute` requests a minute from T0, arms alternating, speculation 1.5x faster per
    token, 101 output tokens each; streamed, with a mean gap per event."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(minutes * per_minute):
        arm = "speculative" if i % 2 else "baseline"
        tpot = float(rng.lognormal(np.log(0.02), 0.3)) / (1.5 if arm == "speculative" else 1.0)
        out.append(
            RequestRecord(
                request_id=f"q{i}",
                run_id=run_id,
                arm=arm,
                t_start=T0 + i * 60.0 / per_minute,
                model="m",
                endpoint="completions",
                stream=True,
                status=200,
                e2e_s=0.1 + 100 * tpot,
                upstream_s=0.1 + 100 * tpot,
                ttft_s=0.1,
                tpot_s=tpot,
                prompt_tokens=20 + i % 17,
                output_tokens=101,
                mean_gap_s=tpot * 1.1,
            )
        )
    return out
