"""Prometheus observations of proxied requests, and the probes."""

from __future__ import annotations

from tests.proxy.conftest import CHAT, SPEC_ONLY, MakeProxy, chat


async def test_metrics_and_probes(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.post(CHAT, json=chat(stream=True)) as resp:
        await resp.read()
    async with proxy.client.get("/metrics") as resp:
        text = await resp.text()
    assert 'specproxy_time_to_first_token_seconds_count{arm="speculative"' in text
    assert 'specproxy_event_gap_seconds_count{arm="speculative"} 9.0' in text
    async with proxy.client.get("/healthz") as resp:
        assert resp.status == 200
    async with proxy.client.get("/readyz") as resp:
        assert resp.status == 200
        assert (await resp.json())["arms"] == {"speculative": True, "baseline": True}
