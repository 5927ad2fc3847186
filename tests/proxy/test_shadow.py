"""Mirrored calls: paired records, the concurrency cap, no client-traffic metrics."""

from __future__ import annotations

import asyncio

from specproxy.metrics import REQUESTS, SHADOW_SKIPPED
from tests.proxy.conftest import CHAT, Arms, MakeProxy, chat


async def test_mirror_pairs(arms: Arms, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 1.0, "mirror_fraction": 1.0})
    for stream in (False, True):
        async with proxy.client.post(CHAT, json=chat(stream=stream)) as resp:
            await resp.read()
            assert resp.headers["x-fake-arm"] == "speculative"  # the client got the primary
    forwarder_done = proxy.app  # shadows finish on their own; wait for them
    for _ in range(100):
        if len(proxy.recorder.records) == 4:
            break
        await asyncio.sleep(0.01)
    records = list(proxy.recorder.records)
    assert len(records) == 4 and forwarder_done is proxy.app
    primaries = [r for r in records if not r.shadow]
    shadows = [r for r in records if r.shadow]
    assert {r.arm for r in primaries} == {"speculative"}
    assert {r.arm for r in shadows} == {"baseline"}
    assert {r.pair_id for r in primaries} == {r.pair_id for r in shadows}
    assert all(r.pair_id == r.request_id for r in primaries)
    stream_shadow = next(r for r in shadows if r.stream)
    assert stream_shadow.output_tokens is not None and stream_shadow.ttft_s is not None
    assert len(arms.baseline.seen) == 2
    # Shadows are not client traffic: requests_total counts the primaries only.
    assert proxy.sample(REQUESTS + "_total", {"arm": "baseline", "status": "200"}) == 0


async def test_shadow_cap_skips_and_counts_never_queues(arms: Arms, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(
        routing={"speculative_share": 1.0, "mirror_fraction": 1.0, "max_concurrent_shadows": 0}
    )
    for _ in range(3):
        async with proxy.client.post(CHAT, json=chat()) as resp:
            await resp.read()
    assert proxy.sample(SHADOW_SKIPPED + "_total") == 3
    assert not arms.baseline.seen
    assert all(not r.shadow for r in proxy.recorder.records)
