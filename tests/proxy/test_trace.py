"""The record of a call: timings taken on the side give the right TTFT and TPOT."""

from __future__ import annotations

from specproxy.metrics import TTFT
from tests.proxy.conftest import COMPLETIONS, SPEC_ONLY, MakeProxy


async def test_known_timings_give_correct_ttft_and_tpot(make_proxy: MakeProxy) -> None:
    """The fake sleeps 200 ms before the first event, then 40 ms between 10 one-token events.

    Lower bounds are exact (a sleep never ends early and the proxy stamps after the upstream
    wrote) and hold for every request. Upper bounds allow 25 ms of TTFT and 30% of TPOT for
    scheduling delay and must hold for the best of three requests: a stall on the shared
    machine only adds delay. A proxy that stamped the wrong event (e.g. the usage chunk or
    headers) or divided by the wrong count would fall outside them every time.
    """
    proxy = await make_proxy(routing=SPEC_ONLY)
    # A fresh proxy's first call pays one-off costs (connections, lazy set-up; up to ~40 ms
    # seen on the loaded machine) that are not what this test measures.
    async with proxy.client.post(
        COMPLETIONS, json={"model": "m", "prompt": "x", "stream": True}
    ) as resp:
        await resp.read()
    ttft, gap, n = 0.2, 0.04, 10
    headers = {"x-fake-mode": "timed", "x-fake-ttft": str(ttft), "x-fake-gap": str(gap)}
    headers["x-fake-n"] = str(n)
    body = {"model": "m", "prompt": "x", "stream": True}
    ttfts, tpots, gaps = [], [], []
    for _ in range(3):
        async with proxy.client.post(COMPLETIONS, json=body, headers=headers) as resp:
            await resp.read()
        rec = proxy.recorder.records[-1]
        assert rec.ttft_s is not None and rec.tpot_s is not None and rec.mean_gap_s is not None
        assert rec.ttft_s >= ttft and rec.tpot_s >= gap
        assert rec.e2e_s >= ttft + gap * (n - 1)
        assert rec.output_tokens == n and rec.n_events == n and rec.tokens_per_event == 1.0
        ttfts.append(rec.ttft_s)
        tpots.append(rec.tpot_s)
        gaps.append(abs(rec.mean_gap_s - gap))
    assert min(ttfts) < ttft + 0.025
    assert min(tpots) < gap * 1.3
    assert min(gaps) < gap * 0.3
    # four observations: the warm-up stream and the three timed ones
    assert proxy.sample(TTFT + "_count", {"arm": "speculative", "endpoint": "completions"}) == 4
