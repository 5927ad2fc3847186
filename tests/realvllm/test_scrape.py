"""The scraper against real vLLM /metrics: acceptance and per-position rates match the requests.

Scrapes are driven by hand around a known batch of requests, so the counter deltas the scraper
turns into rates cover exactly those requests, whose own per-request metrics give the expected
values: acceptance = accepted / drafted tokens, mean acceptance length = 1 + accepted / steps,
rate at position i = (steps that accepted more than i drafts) / steps.
"""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest

from specproxy.appkeys import SCRAPER
from specproxy.realvllm.workload import completion_body, prompts
from tests.realvllm.conftest import Engines, MakeProxy

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


async def test_scraper_reads_real_acceptance_and_positions(
    engines: Engines, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy()  # scrapes once at start, then only when asked
    scraper = proxy.app[SCRAPER]
    await scraper.scrape_once()
    per_request: list[dict[str, Any]] = []
    async with aiohttp.ClientSession() as session:
        for prompt in prompts(5, seed=11):
            body = completion_body(prompt, max_tokens=48)
            async with session.post(f"{engines.speculative_url}/v1/completions", json=body) as r:
                per_request.append((await r.json())["metrics"]["speculative_decoding"])
    samples = await scraper.scrape_once()

    steps = sum(m["num_spec_steps"] for m in per_request)
    accepted = sum(m["num_accepted_draft_tokens"] for m in per_request)
    drafted = sum(m["num_draft_tokens"] for m in per_request)
    k = per_request[0]["num_spec_tokens"]
    positions = [
        sum(sum(m["acceptance_histogram"][i + 1 :]) for m in per_request) / steps for i in range(k)
    ]
    spec = samples["speculative"]
    assert spec.up and not spec.restarted
    assert spec.acceptance_rate == pytest.approx(accepted / drafted)
    assert spec.mean_acceptance_length == pytest.approx(1 + accepted / steps)
    assert spec.position_acceptance == pytest.approx(positions)
    assert list(spec.position_acceptance or ()) == sorted(
        spec.position_acceptance or (), reverse=True
    )
    assert spec.process_start_time is not None

    base = samples["baseline"]
    assert base.up and base.acceptance_rate is None and base.position_acceptance is None
    assert {s.arm for s in proxy.recorder.engine_samples} == {"speculative", "baseline"}

    async with aiohttp.ClientSession() as session, session.get(f"{proxy.url}/metrics") as resp:
        page = await resp.text()
    assert 'specproxy_engine_draft_acceptance_ratio{arm="speculative"}' in page
    assert 'specproxy_engine_position_acceptance_ratio{arm="speculative",position="3"}' in page
    assert re.search(r'specproxy_engine_up\{arm="baseline",endpoint="[^"]+"\} 1\.0', page)
