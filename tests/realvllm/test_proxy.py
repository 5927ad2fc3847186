"""The proxy in front of the real servers: the official client, exact relaying, per-request records.

"Byte-identical to direct" is checked at two strengths:
- exact: a recording tap between proxy and vLLM (tests/realvllm/tap.py) keeps what vLLM sent for
  the very request, and the client must get exactly those bytes (when the proxy injected the
  usage request, exactly those bytes minus the usage event, see `sse`);
- against an independent direct request: equal after blanking `id` and `created` (per request by
  nature) and after joining the events' text, because vLLM groups tokens into events by timing
  (two identical direct requests differ in grouping about one time in four on a loaded machine).
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import openai
import pytest

from specproxy.proxy.headers import ARM_HEADER
from specproxy.records import Arm
from tests.realvllm.conftest import MODEL, Engines, MakeProxy, Proxy
from tests.realvllm.tap import (
    RecordingTap,
    choice_texts,
    normalise_ids,
    sse_events,
)

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPT = "Why is the garden quiet when the river runs to the city"


def request_body(endpoint: str, *, stream: bool, n: int, max_tokens: int = 24) -> dict[str, Any]:
    """Greedy for n=1; seeded sampling for n=2 (greedy choices would all be the same)."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": max_tokens, "ignore_eos": True}
    if endpoint == "completions":
        body["prompt"] = PROMPT
    else:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    body |= {"temperature": 0.0} if n == 1 else {"n": n, "temperature": 0.8, "seed": 1234}
    if stream:
        body["stream"] = True
    return body


async def openai_texts(
    base_url: str, endpoint: str, body: dict[str, Any], headers: dict[str, str]
) -> dict[int, str]:
    """Send `body` with the official client; the generated text per choice index."""
    kwargs = dict(body)
    extra = {"ignore_eos": kwargs.pop("ignore_eos"), "seed": kwargs.pop("seed", None)}
    texts: dict[int, str] = {}
    async with openai.AsyncOpenAI(
        base_url=f"{base_url}/v1", api_key="unused", max_retries=0, default_headers=headers
    ) as api:
        if endpoint == "completions":
            if body.get("stream"):
                async for chunk in await api.completions.create(**kwargs, extra_body=extra):
                    for c in chunk.choices:
                        texts[c.index] = texts.get(c.index, "") + c.text
            else:
                reply = await api.completions.create(**kwargs, extra_body=extra)
                texts = {c.index: c.text for c in reply.choices}
        elif body.get("stream"):
            async for part in await api.chat.completions.create(**kwargs, extra_body=extra):
                for d in part.choices:
                    texts[d.index] = texts.get(d.index, "") + (d.delta.content or "")
        else:
            answer = await api.chat.completions.create(**kwargs, extra_body=extra)
            texts = {c.index: c.message.content or "" for c in answer.choices}
    return texts


@pytest.mark.parametrize("n", [1, 2])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_openai_client_through_the_proxy(
    engines: Engines, proxy: Proxy, endpoint: str, stream: bool, n: int
) -> None:
    body = request_body(endpoint, stream=stream, n=n)
    forced = {ARM_HEADER: "speculative"}
    proxied = await openai_texts(proxy.url, endpoint, body, forced)
    direct = await openai_texts(engines.speculative_url, endpoint, body, {})
    assert sorted(proxied) == list(range(n))
    assert proxied == direct and all(proxied.values())

    [record] = proxy.recorder.records
    assert record.arm == "speculative" and record.status == 200 and record.error_kind is None
    assert record.endpoint == ("completions" if endpoint == "completions" else "chat.completions")
    assert record.stream is stream and record.model == MODEL
    if n == 1:
        # Per-request acceptance, captured from the real body or (streams) the usage chunk
        # that the proxy asked for on the client's behalf.
        assert record.output_tokens == 24
        assert record.acceptance_rate is not None and 0.0 <= record.acceptance_rate <= 1.0
        assert record.mean_acceptance_length is not None and record.mean_acceptance_length >= 1
    else:
        assert record.acceptance_rate is None  # vLLM reports it only for n == 1
    if stream:
        assert record.ttft_s is not None and record.n_events > 0


async def test_baseline_records_have_no_acceptance(proxy: Proxy) -> None:
    body = request_body("chat", stream=True, n=1)
    texts = await openai_texts(proxy.url, "chat", body, {ARM_HEADER: "baseline"})
    assert texts[0]
    [record] = proxy.recorder.records
    assert record.arm == "baseline" and record.output_tokens == 24
    assert record.acceptance_rate is None and record.mean_acceptance_length is None
    # No tokens-per-event bound here: vLLM merges steps whenever its API server lags, and
    # chat skips steps whose bytes do not yet decode to text (byte-level BPE, random weights).
    assert record.n_events >= 1 and record.ttft_s is not None


@pytest.fixture
async def taps(engines: Engines) -> AsyncIterator[dict[Arm, RecordingTap]]:
    taps = {arm: RecordingTap(engines.urls[arm]) for arm in ("speculative", "baseline")}
    for tap in taps.values():
        await tap.start()
    yield taps
    for tap in taps.values():
        await tap.close()


async def raw_post(url: str, path: str, body: dict[str, Any], arm: Arm) -> tuple[str, bytes]:
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}{path}", json=body, headers={ARM_HEADER: arm}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        return resp.headers["Content-Type"], await resp.read()


PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


@pytest.mark.parametrize(
    ("endpoint", "stream", "n"),
    [("completions", True, 1), ("chat", True, 1), ("completions", True, 2), ("chat", False, 2)],
)
async def test_relays_exactly_the_bytes_vllm_sent(
    make_proxy: MakeProxy,
    taps: dict[Arm, RecordingTap],
    endpoint: str,
    stream: bool,
    n: int,
) -> None:
    proxy = await make_proxy(urls={arm: tap.url for arm, tap in taps.items()})
    body = request_body(endpoint, stream=stream, n=n, max_tokens=32)
    if stream and n == 1:
        body["stream_options"] = {"include_usage": True}  # asked by the client: no rewriting
    mark = taps["speculative"].mark()
    content_type, received = await raw_post(proxy.url, PATHS[endpoint], body, "speculative")
    [(head, sent)] = taps["speculative"].responses_since(mark)
    assert received == sent
    assert f"content-type: {content_type}".lower().encode() in head.lower()


async def test_injected_usage_is_removed_and_nothing_else(
    engines: Engines, make_proxy: MakeProxy, taps: dict[Arm, RecordingTap]
) -> None:
    proxy = await make_proxy(urls={arm: tap.url for arm, tap in taps.items()})
    body = request_body("chat", stream=True, n=1, max_tokens=32)  # no include_usage
    mark = taps["speculative"].mark()
    _, received = await raw_post(proxy.url, PATHS["chat"], body, "speculative")
    [(_, sent)] = taps["speculative"].responses_since(mark)

    upstream = sse_events(sent)
    client = sse_events(received)
    usage = json.loads(upstream[-2])
    assert usage["choices"] == [] and "usage" in usage  # what the proxy asked for...
    assert client[-1] == b"[DONE]" and b'"usage"' not in received  # ...and took away again
    assert len(client) == len(upstream) - 1
    fingerprint = f',"system_fingerprint":"{usage["system_fingerprint"]}"'.encode()
    for mine, theirs in zip(client[:-1], upstream[:-2], strict=True):
        assert mine in (theirs, theirs[:-1] + fingerprint + b"}")

    # What the client got has the shape of vLLM's own answer without include_usage.
    _, direct = await raw_post(engines.speculative_url, PATHS["chat"], body, "speculative")
    direct_events = sse_events(direct)
    assert choice_texts(client) == choice_texts(direct_events)
    assert list(json.loads(client[-2])) == list(json.loads(direct_events[-2]))
    assert b'"usage"' not in direct

    [record] = proxy.recorder.records
    spec = usage["metrics"]["speculative_decoding"]
    # null where vLLM says no draft token was proposed (it then reports rate 0.0)
    drafted = spec["num_draft_tokens"] != 0
    assert record.acceptance_rate == (spec["draft_acceptance_rate"] if drafted else None)
    assert record.output_tokens == usage["usage"]["completion_tokens"] == 32


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
async def test_stream_equals_a_direct_request_up_to_ids_and_grouping(
    engines: Engines, proxy: Proxy, endpoint: str
) -> None:
    body = request_body(endpoint, stream=True, n=1, max_tokens=32)
    body["stream_options"] = {"include_usage": True}
    streams = {}
    for name, url in (("proxy", proxy.url), ("direct", engines.speculative_url)):
        content_type, raw = await raw_post(url, PATHS[endpoint], body, "speculative")
        assert content_type == "text/event-stream; charset=utf-8"
        streams[name] = [normalise_ids(p) for p in sse_events(raw)]
    proxied, direct = streams["proxy"], streams["direct"]
    assert choice_texts(proxied) == choice_texts(direct)
    # Byte for byte, every event but its text (and the usage event's timings) is the same.
    assert skeletons(proxied[:-2]) == skeletons(direct[:-2])
    usage = [json.loads(events[-2]) for events in (proxied, direct)]
    assert usage[0]["usage"] == usage[1]["usage"]
    spec = [u["metrics"]["speculative_decoding"] for u in usage]
    assert spec[0] == spec[1]  # greedy: the same drafts are proposed and accepted
    assert list(usage[0]["metrics"]) == list(usage[1]["metrics"])


_TEXT = re.compile(rb'"(text|content)":"(?:[^"\\]|\\.)*"')


def skeletons(events: list[bytes]) -> set[bytes]:
    """The distinct events once their generated text is blanked."""
    return {_TEXT.sub(rb'"\1":""', event) for event in events}
