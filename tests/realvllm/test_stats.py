"""The stats job on real traffic agrees with a direct measurement of the same two servers.

Each round sends one prompt four times at concurrency 1: through the proxy and directly, to
each arm, the two requests to one arm back to back, in an order that rotates. The app's own
stats job computes, from the app's store, the e2e median speedup with its 95% bootstrap CI,
and that CI must contain the ratio of medians measured directly. Because both measurements
see the same prompts at nearly the same moments, they share the machine's drifts (this runs on
2 busy cores) and differ only by per-request jitter, which the CI's width covers; two
independent samples would instead miss each other's 95% CI several times in a hundred.
"""

from __future__ import annotations

import statistics
import time

import aiohttp
import pytest

from specproxy.appkeys import STATS_JOB, STORE
from specproxy.config import ScrapeConfig
from specproxy.proxy.headers import ARM_HEADER
from specproxy.realvllm.workload import completion_body, prompts
from specproxy.records import Arm
from tests.realvllm.conftest import Engines, MakeStatsApp

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ROUNDS = 24  # a multiple of 4: every order occurs equally often
MAX_TOKENS = 64


async def timed(session: aiohttp.ClientSession, url: str, prompt: str, arm: Arm) -> float:
    body = completion_body(prompt, max_tokens=MAX_TOKENS)
    started = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body, headers={ARM_HEADER: arm}) as resp:
        await resp.read()
        assert resp.status == 200
    return time.perf_counter() - started


async def test_stats_job_speedup_ci_contains_the_direct_ratio(
    engines: Engines, make_stats_app: MakeStatsApp
) -> None:
    app, proxy_url = await make_stats_app("realvllm-stats", ScrapeConfig(interval_s=1.0))

    direct: dict[Arm, list[float]] = {arm: [] for arm in ("speculative", "baseline")}
    async with aiohttp.ClientSession() as session:
        for i, prompt in enumerate(prompts(ROUNDS, seed=21)):
            # Proxied and direct requests to one arm go back to back; which arm and which of
            # the two goes first rotate over every four rounds, so neither side is favoured.
            arms = (
                ["speculative", "baseline"]
                if i % 2 == 0
                else list(reversed(("speculative", "baseline")))
            )
            proxy_first = (i // 2) % 2 == 0
            for arm in arms:
                if proxy_first:
                    await timed(session, proxy_url, prompt, arm)
                direct[arm].append(await timed(session, engines.urls[arm], prompt, arm))
                if not proxy_first:
                    await timed(session, proxy_url, prompt, arm)
    direct_ratio = statistics.median(direct["baseline"]) / statistics.median(direct["speculative"])

    await app[STORE].flush()
    result = (await app[STATS_JOB].run_once())["results"]["all"]["all"]
    assert result["samples"] == {"speculative": ROUNDS, "baseline": ROUNDS}
    speedup = result["metrics"]["e2e"]["speedup"]["median"]
    print(
        f"real vLLM CPU, {ROUNDS} rounds, max_tokens={MAX_TOKENS}: stats job e2e median speedup "
        f"{speedup['estimate']:.2f} [{speedup['lower']:.2f}, {speedup['upper']:.2f}], "
        f"direct ratio of medians {direct_ratio:.2f}"
    )
    assert speedup["status"] == "ok"
    lower, upper = speedup["lower"], speedup["upper"]
    assert lower is not None and upper is not None and lower <= direct_ratio <= upper
    engine = result["engine"]
    assert engine["speculative"]["acceptance_rate"] is not None
    assert engine["baseline"]["acceptance_rate"] is None
