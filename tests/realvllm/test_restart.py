"""Restarting the real speculative engine under the proxy (runs last: it leaves a cold engine).

With `on_down = "error"` (no failing open), while the engine is down the proxy answers 502 with an
OpenAI-style body and /readyz says which arm is missing; once it is back, the scraper sees the
new process start time, the warm-up window opens at the restart, and requests are recorded again.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

import aiohttp
import pytest

from specproxy.appkeys import SCRAPER
from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.proxy.headers import ARM_HEADER
from specproxy.realvllm.workload import completion_body, prompts
from specproxy.records import Arm
from specproxy.stats.job.tick import compute_stats
from specproxy.stats.warmup import restart_times
from specproxy.store.memory import MemoryStore
from tests.realvllm.conftest import Engines, MakeProxy, Proxy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

WARMUP_REQUESTS = 3


async def post(proxy: Proxy, arm: Arm, prompt: str) -> tuple[int, dict[str, Any]]:
    body = completion_body(prompt, max_tokens=16)
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy.url}/v1/completions", json=body, headers={ARM_HEADER: arm}) as resp,
    ):
        return resp.status, await resp.json()


async def readyz(proxy: Proxy) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/readyz") as resp:
        return resp.status, await resp.json()


async def eventually(condition: Any, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.2)


async def test_restart_of_the_speculative_engine(engines: Engines, make_proxy: MakeProxy) -> None:
    if engines.pair is None:
        pytest.skip("attached to servers this session did not start: cannot restart them")
    proxy = await make_proxy(
        scrape_interval_s=0.5,
        warmup={"restart_requests": WARMUP_REQUESTS, "restart_seconds": 0.0},
        on_down="error",  # the arm's own failure reaches the client (no failing open)
    )
    scraper = proxy.app[SCRAPER]
    spec_state = scraper.states["speculative"]
    texts = prompts(12, seed=5)
    for prompt in texts[:2]:
        assert (await post(proxy, "speculative", prompt))[0] == 200
    await eventually(lambda: spec_state.up is True and spec_state.snapshot is not None)

    await asyncio.to_thread(engines.pair.stop_arm, "speculative")
    status, body = await post(proxy, "speculative", texts[2])
    assert status == 502 and body["error"]["code"] == 502 and body["error"]["message"]
    status, ready = await readyz(proxy)
    assert status == 503 and ready == {
        "ready": False,
        "arms": {"speculative": False, "baseline": True},
        "degraded": [],
    }
    assert (await post(proxy, "baseline", texts[3]))[0] == 200  # the other arm still serves
    await eventually(lambda: spec_state.up is False)
    # `process_start_time_seconds` (whole-second boot time plus ticks) runs up to ~1 s early
    # against time.time() on these machines; a pause keeps every old request before it.
    await asyncio.sleep(1.5)

    restarted_at = time.time()
    await asyncio.to_thread(engines.pair.start_arm, "speculative")
    assert (await readyz(proxy))[0] == 200
    await eventually(lambda: len(scraper.restart_times("speculative")) == 1)
    [restart] = scraper.restart_times("speculative")
    assert restarted_at - 1.5 <= restart <= time.time()

    for prompt in texts[4:10]:  # recording resumes
        assert (await post(proxy, "speculative", prompt))[0] == 200
    spec_records = [r for r in proxy.recorder.records if r.arm == "speculative"]
    assert [r.status for r in spec_records] == [200, 200, 502] + [200] * 6
    assert spec_records[2].error_kind == "connect"
    # per-request acceptance is recorded again (null where the proposer found nothing to draft)
    assert any(r.acceptance_rate is not None for r in spec_records[3:])

    # The restart is dated from the stored engine samples no earlier than the first failed
    # scrape, and the scraper's live state agrees.
    samples = list(proxy.recorder.engine_samples)
    assert any(s.restarted for s in samples) and any(not s.up for s in samples)
    [stored] = restart_times(samples, "speculative")
    first_down = min(s.t for s in samples if s.arm == "speculative" and not s.up)
    assert first_down <= stored <= time.time()

    # The stats job leaves out whole time units after it: those holding the first usable
    # requests from the restart's unit on (the 502 fills no slot), and nothing else.
    store = MemoryStore(StoreConfig(url="memory://"), run_id="default")
    await store.start()
    for rec in proxy.recorder.records:
        store.record(rec)
    for sample in samples:
        store.record_engine(sample)
    await store.flush()
    warmup = WarmupConfig(requests=0, restart_requests=WARMUP_REQUESTS, restart_seconds=0.0)
    result = (
        await compute_stats(
            store,
            run_id="default",
            stats_cfg=StatsConfig(windows_s=(None,), resamples=200),
            warmup=warmup,
        )
    )["results"]["all"]["all"]
    await store.close()
    unit_s = result.get("unit_s")
    assert unit_s is not None
    usable = [r for r in spec_records if r.status == 200]
    unit = [math.floor(r.t_start / unit_s) for r in usable]
    after = [u for u in unit if u >= math.floor(stored / unit_s)]
    gone = set(range(math.floor(stored / unit_s), after[WARMUP_REQUESTS - 1] + 1))
    expected = sum(u in gone for u in unit)
    assert expected >= WARMUP_REQUESTS
    assert result["excluded_warmup"]["speculative"] == expected
    assert result["samples"]["speculative"] == len(usable) - expected
