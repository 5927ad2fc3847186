"""Prometheus observations of proxied requests, and the probes."""

from __future__ import annotations

import asyncio
import re

from specproxy.appkeys import FLEET
from tests.proxy.conftest import CHAT, SPEC_ONLY, MakeProxy, chat


async def test_metrics_and_probes(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.post(CHAT, json=chat(stream=True)) as resp:
        await resp.read()
    async with proxy.client.get("/metrics") as resp:
        text = await resp.text()
    assert 'specproxy_time_to_first_token_seconds_count{arm="speculative"' in text
    assert proxy.sample("specproxy_event_gap_seconds_count", {"arm": "speculative"}) == 9.0
    async with proxy.client.get("/healthz") as resp:
        assert resp.status == 200
    async with proxy.client.get("/readyz") as resp:
        assert resp.status == 200
        assert (await resp.json())["arms"] == {"speculative": True, "baseline": True}


async def test_model_label_is_bounded_whatever_the_clients_send(make_proxy: MakeProxy) -> None:
    """5,000 distinct model strings: the model label takes only served/allowed values + other."""
    proxy = await make_proxy(routing=SPEC_ONLY, model_allow=["allowed-model"])
    labels = proxy.app[FLEET].labels
    # What the scraper reads from the arms' /v1/models (tests/scrape/test_loop.py); the fake
    # arms here have no /metrics, so the scraper never asks them.
    labels.set_served(["tiny-llama"])
    assert labels.known == {"tiny-llama", "allowed-model"}

    async def send(model: str) -> None:
        body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
        async with proxy.client.post(CHAT, json=body) as resp:
            assert resp.status == 200  # the fake upstream serves any model
            await resp.read()

    def model_values(text: str) -> set[str]:
        return set(re.findall(r'model="([^"]*)"', text))

    for start in (0, 2500):
        for batch in range(start, start + 2500, 50):
            await asyncio.gather(*(send(f"client-model-{i}") for i in range(batch, batch + 50)))
        if start == 0:
            first = (await (await proxy.client.get("/metrics")).read()).decode()
    await asyncio.gather(send("tiny-llama"), send("allowed-model"))
    text = (await (await proxy.client.get("/metrics")).read()).decode()
    assert model_values(text) == {"tiny-llama", "allowed-model", "other"}  # bound: 2 + 1
    assert proxy.sample("specproxy_requests_total", {"model": "other"}) == 5000
    # Series after 2,500 more invented names: only the two real models were added.
    series = [line for line in text.splitlines() if line.startswith("specproxy_")]
    grown = [line for line in first.splitlines() if line.startswith("specproxy_")]
    assert len([s for s in series if 'model="other"' in s]) == len(
        [s for s in grown if 'model="other"' in s]
    )
