"""The stats job on real traffic agrees with a direct measurement of the same two servers.

Each round sends one prompt four times at concurrency 1: through the proxy and directly, to
each arm, the two requests to one arm back to back, in an order that rotates. The app's own
stats job computes, from the app's store, the e2e median speedup with its 95% bootstrap CI,
and that CI must overlap the 95% bootstrap CI of the ratio of medians measured directly. Both
measurements see the same prompts at nearly the same moments and share the machine's drifts
(this runs on 2 busy cores), but each has its own per-request jitter: the direct ratio of 24
requests per arm is itself an estimate, and it fell outside the job's interval (2.89 against
[2.46, 2.77]) in one CI run of a tree that passed the run before. Two intervals of the same
quantity fail to overlap far more rarely; a proxy that biased the speedup by more than about
both widths would still fail.
"""

from __future__ import annotations

import statistics
import time

import aiohttp
import numpy as np
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


def ratio_interval(
    control: list[float], treatment: list[float], resamples: int = 4000
) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of median(control) / median(treatment), each arm
    resampled on its own (seeded: the same data give the same interval)."""
    rng = np.random.default_rng(0)
    c, t = np.asarray(control), np.asarray(treatment)
    ratios = np.median(rng.choice(c, (resamples, c.size)), axis=1) / np.median(
        rng.choice(t, (resamples, t.size)), axis=1
    )
    low, high = np.quantile(ratios, [0.025, 0.975])
    return float(low), float(high)


async def test_stats_job_speedup_ci_overlaps_the_direct_ratio_ci(
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
    direct_lower, direct_upper = ratio_interval(direct["baseline"], direct["speculative"])

    await app[STORE].flush()
    result = (await app[STATS_JOB].run_once())["results"]["all"]["all"]
    assert result["samples"] == {"speculative": ROUNDS, "baseline": ROUNDS}
    speedup = result["metrics"]["e2e"]["speedup"]["median"]
    print(
        f"real vLLM CPU, {ROUNDS} rounds, max_tokens={MAX_TOKENS}: stats job e2e median speedup "
        f"{speedup['estimate']:.2f} [{speedup['lower']:.2f}, {speedup['upper']:.2f}], "
        f"direct ratio of medians {direct_ratio:.2f} [{direct_lower:.2f}, {direct_upper:.2f}]"
    )
    assert speedup["status"] == "ok"
    lower, upper = speedup["lower"], speedup["upper"]
    assert lower is not None and upper is not None
    assert lower <= direct_upper and direct_lower <= upper  # the two intervals overlap
    engine = result["engine"]
    assert engine["speculative"]["acceptance_rate"] is not None
    assert engine["baseline"]["acceptance_rate"] is None
