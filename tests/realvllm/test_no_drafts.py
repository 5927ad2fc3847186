"""A run where speculation cannot pay off, on the real engines: random prompts, no drafts.

Random token-id prompts (no token repeats) sampled at temperature 1 give the n-gram proposer
nothing to copy, so the speculative engine proposes no drafts at all (its per-request metrics
and its /metrics counters both say 0) and every step is a plain decode plus the proposer's
overhead. Through the proxy, with its store, scraper and stats job, the result must then:
diagnose "no drafts proposed" (the scrape worked: not "no metrics"), give an E2E verdict of
"slower" or "inconclusive" (never "faster"), and a headline that names its metric and claims
no speedup. Everything asserted is a token count, a counter or a verdict; no latency ratio.
"""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import pytest

from specproxy.appkeys import SCRAPER, STATS_JOB, STORE
from specproxy.config import ScrapeConfig
from specproxy.proxy.headers import ARM_HEADER
from specproxy.realvllm.workload import completion_body, random_token_prompts
from specproxy.scrape.parse import EngineSnapshot, SpecFormat, parse_metrics
from specproxy.stats.result import METRICS
from tests.realvllm.conftest import Engines, MakeStatsApp

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

ROUNDS = 24  # one request per arm per round: 48 short requests
PROMPT_TOKENS = 48
MAX_TOKENS = 32


async def _snapshot(session: aiohttp.ClientSession, url: str) -> EngineSnapshot:
    async with session.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        return parse_metrics(await resp.text(), t=time.time())


async def test_random_prompts_give_no_drafts_and_no_speedup(
    engines: Engines, make_stats_app: MakeStatsApp
) -> None:
    # Scrapes are driven by hand (one before the traffic, one after), so the counter deltas
    # the diagnosis reads cover exactly this test's requests.
    app, proxy_url = await make_stats_app("realvllm-no-drafts", ScrapeConfig(interval_s=3600.0))
    scraper = app[SCRAPER]

    per_request: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        # The first sampled (temperature > 0) request of an engine compiles its sampling path
        # (over a second on the speculative arm here): pay that before anything is counted.
        for ids in random_token_prompts(2, PROMPT_TOKENS, seed=41):
            for url in engines.urls.values():
                body = completion_body(ids, max_tokens=4, temperature=1.0, seed=0)
                async with session.post(f"{url}/v1/completions", json=body) as resp:
                    assert resp.status == 200
        before = await _snapshot(session, engines.speculative_url)
        await scraper.scrape_once()
        for i, ids in enumerate(random_token_prompts(ROUNDS, PROMPT_TOKENS, seed=14)):
            arms = (
                ["speculative", "baseline"]
                if i % 2 == 0
                else list(reversed(("speculative", "baseline")))
            )  # neither arm always first
            for arm in arms:
                body = completion_body(ids, max_tokens=MAX_TOKENS, temperature=1.0, seed=i)
                async with session.post(
                    f"{proxy_url}/v1/completions", json=body, headers={ARM_HEADER: arm}
                ) as resp:
                    assert resp.status == 200
                    payload = await resp.json()
                usage = payload["usage"]
                assert (usage["prompt_tokens"], usage["completion_tokens"]) == (
                    PROMPT_TOKENS,
                    MAX_TOKENS,
                )
                if arm == "speculative":
                    per_request.append(payload["metrics"]["speculative_decoding"])
        samples = await scraper.scrape_once()
        after = await _snapshot(session, engines.speculative_url)
        baseline = await _snapshot(session, engines.baseline_url)

    # The engine itself: no drafts, per request and in its counters (which it does export, at 0).
    assert [(m["num_spec_steps"], m["num_draft_tokens"]) for m in per_request] == [(0, 0)] * ROUNDS
    assert before.spec_format is after.spec_format is SpecFormat.V1
    assert baseline.spec_format is None
    assert after.num_drafts is not None and before.num_drafts is not None
    assert after.num_drafts - before.num_drafts == 0
    assert after.num_draft_tokens == before.num_draft_tokens
    assert after.generation_tokens is not None and before.generation_tokens is not None
    assert after.generation_tokens - before.generation_tokens == ROUNDS * MAX_TOKENS
    spec_sample = samples["speculative"]
    assert spec_sample.up and not spec_sample.restarted
    assert spec_sample.acceptance_rate is None and spec_sample.mean_acceptance_length is None

    await app[STORE].flush()
    result = (await app[STATS_JOB].run_once())["results"]["all"]["all"]
    assert result["samples"] == {"speculative": ROUNDS, "baseline": ROUNDS}
    engine = result["engine"]["speculative"]
    assert engine["up_samples"] >= 1 and engine["acceptance_rate"] is None
    diagnosis = result["diagnosis"]
    codes = [r["code"] for r in diagnosis["reasons"]]
    assert "no_drafts" in codes and "no_engine_metrics" not in codes
    message = next(r["message"] for r in diagnosis["reasons"] if r["code"] == "no_drafts")
    assert message.startswith("no drafts proposed")

    e2e = result["metrics"]["e2e"]
    verdict = e2e["verdict"]
    speedup = e2e["speedup"]["median"]
    headline = diagnosis["summary"]
    print(
        f"real vLLM CPU, random prompts, {ROUNDS} per arm, max_tokens={MAX_TOKENS}, T=1: "
        f"drafts {after.num_drafts - before.num_drafts:g}, E2E verdict {verdict}, "
        f"E2E median speedup {speedup['estimate']:.2f} [{speedup['lower']:.2f}, "
        f"{speedup['upper']:.2f}], headline: {headline!r}, reasons: {codes}"
    )
    assert verdict in ("slower", "inconclusive")
    # The headline names its metric and statistic, and claims no speedup.
    labels = [spec.label for spec in METRICS.values()]
    assert any(f"{label} median" in headline for label in labels), headline
    assert "helps" not in headline and "faster" not in headline
    if verdict == "slower":
        assert "slower" in headline or "hurts" in headline
