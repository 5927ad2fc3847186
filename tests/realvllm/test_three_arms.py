"""A/B/n on real engines: the baseline, n-gram k=4 (the package's pair) and a third real vLLM
CPU server with n-gram k=2, behind one proxy configured with `[arms.NAME]` tables.

Asserted: every arm's requests are recorded under its name; the stats job compares each
treatment with the control (two comparisons, Bonferroni at alpha / 2); each treatment's k is
read from its own engine's per-position counters (2 and 4), so scraping and diagnosis are per
arm. Speeds are printed, never asserted (2 shared cores). The third server's resident memory
(its api_server plus EngineCore) is printed: the figure behind "if memory allows".
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import STATS_JOB, STORE
from specproxy.config import Config
from specproxy.proxy.headers import ARM_HEADER
from specproxy.realvllm.launcher import (
    OMP_BIND_ENV,
    SPECULATIVE_CONFIG,
    VllmServer,
    core_split,
    wait_all_healthy,
)
from specproxy.realvllm.model_dir import build_model_dir
from specproxy.realvllm.workload import completion_body, prompts
from tests.realvllm.conftest import Engines, warm_up

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

REQUESTS = 12  # per arm
MAX_TOKENS = 48
K2 = {**SPECULATIVE_CONFIG, "num_speculative_tokens": 2}


def group_rss_bytes(pgid: int) -> int:
    """Resident memory of every process in the process group (a server and its EngineCore)."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[2]) != pgid:  # field 5 of stat: the process group
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


@pytest.fixture(scope="module")
def k2_server(engines: Engines, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if engines.pair is None:
        pytest.skip("attached to servers started elsewhere: no third server to start")
    pair = engines.pair
    cores = core_split(sorted(os.sched_getaffinity(0))).get("speculative")
    server = VllmServer(
        "ngram-k2",
        python=pair.python,
        model_dir=build_model_dir(pair.cache_dir),
        log_path=tmp_path_factory.mktemp("vllm-k2") / "vllm-ngram-k2.log",
        extra_env={OMP_BIND_ENV: cores} if cores else None,
        speculative_config=K2,
    )
    server.start()
    try:
        wait_all_healthy([server], 600.0)
        warm_up({"ngram-k2": server.url})
        yield server.url
        pid = server.pid
        if pid is not None:
            print(
                f"third vLLM server (n-gram k=2) resident: {group_rss_bytes(pid) / 2**20:.0f} MiB"
            )
    finally:
        server.stop()


async def test_three_real_arms_are_each_recorded_scraped_and_compared(
    engines: Engines, k2_server: str, aiohttp_server: AiohttpServer
) -> None:
    cfg = Config.from_mapping(
        {
            "arms": {
                "base": {"role": "control", "urls": [engines.baseline_url]},
                "ngram-k2": {"urls": [k2_server], "labels": {"method": "ngram", "k": "2"}},
                "ngram-k4": {
                    "urls": [engines.speculative_url],
                    "labels": {"method": "ngram", "k": "4"},
                },
            },
            "run_id": "realvllm-abn",
            "routing": {"allow_forced_arm": True},
            "store": {"url": "memory://"},
            "scrape": {"interval_s": 1.0},
            "stats": {"interval_s": 3600.0, "windows_s": ["all"], "resamples": 1000},
            "warmup": {"requests": 0, "restart_seconds": 0.0},
        }
    )
    app = create_app(cfg, registry=CollectorRegistry())
    url = str((await aiohttp_server(app)).make_url("")).rstrip("/")
    arms = ("base", "ngram-k2", "ngram-k4")
    answered: dict[str, int] = dict.fromkeys(arms, 0)
    async with aiohttp.ClientSession() as session:
        for i, prompt in enumerate(prompts(REQUESTS, seed=31)):
            order = arms[i % 3 :] + arms[: i % 3]  # rotate: no arm always goes first
            for arm in order:
                body = completion_body(prompt, max_tokens=MAX_TOKENS)
                headers = {ARM_HEADER: arm}
                async with session.post(f"{url}/v1/completions", json=body, headers=headers) as r:
                    await r.read()
                    assert r.status == 200 and r.headers[ARM_HEADER] == arm
                    answered[arm] += 1
    await app[STORE].flush()
    result = await app[STATS_JOB].run_once()
    window = result["results"]["all"]["all"]
    assert answered == dict.fromkeys(arms, REQUESTS)
    assert window["control"] == "base" and window["treatments"] == ["ngram-k2", "ngram-k4"]
    comparisons = window["comparisons"]
    assert set(comparisons) == {"ngram-k2", "ngram-k4"}
    multiplicity = window["multiplicity"]
    assert multiplicity["treatments"] == 2
    assert multiplicity["alpha_per_comparison"] == pytest.approx(multiplicity["alpha"] / 2)
    for name, k in (("ngram-k2", 2), ("ngram-k4", 4)):
        comparison = comparisons[name]
        assert comparison["samples"] == {"base": REQUESTS, name: REQUESTS}
        engine = comparison["engine"]
        assert engine[name]["num_speculative_tokens"] == k
        assert engine[name]["acceptance_rate"] is not None
        assert engine["base"]["acceptance_rate"] is None
        median = comparison["metrics"]["e2e"]["speedup"]["median"]
        print(
            f"real vLLM CPU, {REQUESTS} requests per arm, max_tokens={MAX_TOKENS}: {name} e2e "
            f"median speedup {median['estimate']} [{median['lower']}, {median['upper']}], "
            f"acceptance {engine[name]['acceptance_rate']:.2f}"
        )
    assert window["best"]["state"] in ("winner", "no_winner_yet")
