"""Relaying the upstream's answer: byte-exact streams, cut-off on a broken upstream."""

from __future__ import annotations

import aiohttp
import numpy as np
import pytest

from specproxy.records import RECORD_FIELDS
from specproxy.stats.job.rows import usable_mask
from tests.faults.upstream import FaultUpstream
from tests.proxy.conftest import CHAT, COMPLETIONS, SPEC_ONLY, Arms, MakeProxy, chat, direct
from tests.proxy.fake_upstream import fixture_stream


@pytest.mark.parametrize("chunk", [0, 1, 7, 333])
@pytest.mark.parametrize("include_usage", [False, True])
async def test_stream_is_byte_identical_to_direct(
    arms: Arms, make_proxy: MakeProxy, chunk: int, include_usage: bool
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    body = chat(stream=True, stream_options={"include_usage": include_usage})
    headers = {"x-fake-chunk": str(chunk)}
    expected = await direct(arms.speculative_url, CHAT, body, headers)
    async with proxy.client.post(CHAT, json=body, headers=headers) as resp:
        got = await resp.read()
        assert resp.headers["x-specproxy-arm"] == "speculative"
        assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
    assert got == expected
    name = "usage" if include_usage else "nousage"
    assert got == fixture_stream(f"chat_stream_{name}_spec.sse")
    # Usage was asked for upstream either way, so the record has tokens and acceptance.
    assert arms.speculative.seen[-1]["body"]["stream_options"]["include_usage"] is True
    rec = proxy.recorder.records[-1]
    assert rec.output_tokens == 32 and rec.prompt_tokens == 20 and rec.n_events == 10
    assert rec.mean_acceptance_length == pytest.approx(4.428571428571429)
    assert rec.tokens_per_event == pytest.approx(3.2)
    assert rec.error_kind is None and rec.status == 200 and rec.stream


async def test_completion_stream_with_token_ids(arms: Arms, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    body = {"model": "tiny-llama", "prompt": "x", "stream": True, "return_token_ids": True}
    async with proxy.client.post(COMPLETIONS, json=body, headers={"x-fake-chunk": "5"}) as resp:
        got = await resp.read()
    assert b'"usage"' not in got and got.endswith(b"data: [DONE]\n\n")
    rec = proxy.recorder.records[-1]
    assert rec.endpoint == "completions" and rec.output_tokens == 24 and rec.n_events == 8


async def test_broken_stream_is_cut_off_for_the_client_too(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    body = chat(stream=True, stream_options={"include_usage": True})
    received = b""
    async with proxy.client.post(CHAT, json=body, headers={"x-fake-mode": "break"}) as resp:
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            async for chunk in resp.content.iter_any():
                received += chunk
    events = fixture_stream("chat_stream_usage_spec.sse").split(b"\n\n")
    assert received == b"".join(e + b"\n\n" for e in events[:3])
    assert b"[DONE]" not in received
    rec = proxy.recorder.records[-1]
    assert rec.error_kind == "broken" and rec.status == 200 and rec.tpot_s is None


@pytest.mark.parametrize("usage", [False, True])
async def test_garbage_event_stream_is_relayed_but_never_a_usable_sample(
    make_proxy: MakeProxy, usage: bool
) -> None:
    """Before: a 200 text/event-stream of random bytes was recorded with no error and 0 events,
    and counted as a usable request."""
    async with FaultUpstream(seed=7) as faulty:
        proxy = await make_proxy(routing=SPEC_ONLY, speculative_url=faulty.url)
        body = chat(stream=True, stream_options={"include_usage": usage})
        upstream_bytes = await direct(faulty.url, CHAT, body, {"x-fault": "garbage_sse"})
        async with proxy.client.post(CHAT, json=body, headers={"x-fault": "garbage_sse"}) as resp:
            assert resp.status == 200
            got = await resp.read()
    assert got == upstream_bytes and len(got) == 64 * 512  # relayed as it came
    (rec,) = proxy.recorder.records
    assert rec.status == 200 and rec.error_kind == "malformed_stream" and rec.n_events == 0
    assert rec.tpot_s is None
    arrays = {name: np.array([getattr(rec, name)], dtype=object) for name in RECORD_FIELDS}
    assert not usable_mask(arrays).any()  # the statistics' own filter drops it
