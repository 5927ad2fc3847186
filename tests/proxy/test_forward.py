"""The proxy end to end, against fake vLLM arms that replay the real fixtures."""

from __future__ import annotations

import asyncio
import json
import logging
import socket

import aiohttp
import pytest
from scipy.stats import binomtest

from specproxy.metrics import OUTPUT_TOKENS, REQUESTS, SHADOW_SKIPPED, TTFT, UPSTREAM_ERRORS
from specproxy.records import Arm
from tests.conftest import fixture_path
from tests.proxy.conftest import Arms, MakeProxy
from tests.proxy.fake_upstream import fixture_stream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SPEC_ONLY = {"speculative_share": 1.0}


def chat(**extra: object) -> dict[str, object]:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], **extra}


async def direct(url: str, path: str, body: object, headers: dict[str, str] | None = None) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url.rstrip("/") + path, json=body, headers=headers) as resp,
    ):
        return await resp.read()


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


async def test_without_injection_the_request_body_is_forwarded_untouched(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY, inject_usage=False)
    raw = b'{"model": "tiny-llama", "stream": true,  "messages": []}'
    async with proxy.client.post(CHAT, data=raw, headers={"Content-Type": "application/json"}):
        pass
    assert arms.speculative.seen[-1]["body"] == json.loads(raw)
    assert "stream_options" not in arms.speculative.seen[-1]["body"]
    assert proxy.recorder.records[-1].output_tokens is None


async def test_completion_stream_with_token_ids(arms: Arms, make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    body = {"model": "tiny-llama", "prompt": "x", "stream": True, "return_token_ids": True}
    async with proxy.client.post(COMPLETIONS, json=body, headers={"x-fake-chunk": "5"}) as resp:
        got = await resp.read()
    assert b'"usage"' not in got and got.endswith(b"data: [DONE]\n\n")
    rec = proxy.recorder.records[-1]
    assert rec.endpoint == "completions" and rec.output_tokens == 24 and rec.n_events == 8


async def test_n2_stream_is_not_injected_and_passes_verbatim(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    body = {"model": "tiny-llama", "prompt": "x", "stream": True, "n": 2}
    async with proxy.client.post(COMPLETIONS, json=body, headers={"x-fake-chunk": "1"}) as resp:
        got = await resp.read()
    assert got == fixture_stream("completion_stream_n2_spec.sse")
    assert "stream_options" not in arms.speculative.seen[-1]["body"]


@pytest.mark.parametrize(("arm", "fixture"), [("speculative", "spec"), ("baseline", "baseline")])
async def test_non_stream_body_and_record(make_proxy: MakeProxy, arm: str, fixture: str) -> None:
    proxy = await make_proxy(routing={"speculative_share": 1.0 if arm == "speculative" else 0.0})
    async with proxy.client.post(CHAT, json=chat()) as resp:
        got = await resp.read()
        assert resp.status == 200
        assert resp.headers["x-specproxy-arm"] == arm
        request_id = resp.headers["x-specproxy-request-id"]
    payload = fixture_path(f"chat_nonstream_{fixture}.json").read_bytes()
    assert got == payload
    rec = proxy.recorder.records[-1]
    assert rec.request_id == request_id and rec.arm is Arm(arm) and not rec.stream
    usage = json.loads(payload)["usage"]
    assert rec.output_tokens == usage["completion_tokens"]
    assert rec.ttft_s is None and rec.e2e_s >= rec.upstream_s > 0
    if arm == "speculative":
        assert rec.acceptance_rate == 1.0
    assert proxy.sample(REQUESTS + "_total", {"arm": arm, "status": "200"}) == 1
    assert proxy.sample(OUTPUT_TOKENS + "_count", {"arm": arm}) == 1


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


async def test_weighted_shares_through_the_proxy(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 0.3, "seed": 11})
    n = 300
    arms = []
    for _ in range(n):
        async with proxy.client.post(CHAT, json=chat()) as resp:
            arms.append(resp.headers["x-specproxy-arm"])
    hits = arms.count("speculative")
    assert binomtest(hits, n, 0.3).pvalue > 1e-3
    assert len(proxy.recorder.records) == n


async def test_sticky_header_and_user_through_the_proxy(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"mode": "sticky", "sticky_header": "x-tenant"})
    seen: dict[str, set[str]] = {}
    for i in range(40):
        key = f"tenant-{i % 8}"
        async with proxy.client.post(CHAT, json=chat(), headers={"x-tenant": key}) as resp:
            seen.setdefault(key, set()).add(resp.headers["x-specproxy-arm"])
    assert all(len(arms) == 1 for arms in seen.values())
    by_user = await make_proxy(routing={"mode": "sticky", "sticky_source": "user"})
    for user in ("alice", "bob", "carol"):
        got = set()
        for _ in range(5):
            async with by_user.client.post(CHAT, json=chat(user=user)) as resp:
                got.add(resp.headers["x-specproxy-arm"])
        assert len(got) == 1


async def test_forced_arm(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 1.0, "allow_forced_arm": True})
    async with proxy.client.post(CHAT, json=chat(), headers={"x-specproxy-arm": "baseline"}) as r:
        assert r.headers["x-specproxy-arm"] == "baseline"
        assert r.headers["x-fake-arm"] == "baseline"
    async with proxy.client.post(CHAT, json=chat(), headers={"x-specproxy-arm": "nope"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "x-specproxy-arm"


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
    assert {r.arm for r in primaries} == {Arm.SPECULATIVE}
    assert {r.arm for r in shadows} == {Arm.BASELINE}
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


async def test_upstream_refused_is_502(make_proxy: MakeProxy) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    proxy = await make_proxy(routing=SPEC_ONLY, speculative_url=closed)
    async with proxy.client.post(CHAT, json=chat(stream=True)) as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == 502 and error["type"] == "BadGateway"
        assert resp.headers["x-specproxy-arm"] == "speculative"
    rec = proxy.recorder.records[-1]
    assert rec.status == 502 and rec.error_kind == "connect"
    assert proxy.sample(UPSTREAM_ERRORS + "_total", {"arm": "speculative", "kind": "connect"}) == 1


async def test_upstream_timeout_is_504(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY, timeouts={"read_s": 0.2})
    async with proxy.client.post(CHAT, json=chat(), headers={"x-fake-mode": "hang"}) as resp:
        assert resp.status == 504
        assert (await resp.json())["error"]["type"] == "GatewayTimeout"
    rec = proxy.recorder.records[-1]
    assert rec.status == 504 and rec.error_kind == "timeout"


async def test_upstream_error_passes_through_unchanged(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.post(CHAT, json=chat(), headers={"x-fake-mode": "error404"}) as resp:
        assert resp.status == 404
        assert await resp.read() == fixture_path("error_unknown_model.json").read_bytes()
    rec = proxy.recorder.records[-1]
    assert rec.status == 404 and rec.error_kind == "http_4xx"


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


async def test_client_disconnect_cancels_upstream_and_is_recorded(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    url = proxy.server.make_url(CHAT)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url, json=chat(stream=True), headers={"x-fake-mode": "slow"})
        await resp.content.readany()
        resp.close()  # drop the connection mid-stream
    for _ in range(200):
        if arms.speculative.aborted and proxy.recorder.records:
            break
        await asyncio.sleep(0.01)
    assert arms.speculative.aborted == 1 and arms.speculative.completed == 0
    rec = proxy.recorder.records[-1]
    assert rec.disconnected and rec.error_kind == "disconnected"
    assert len(proxy.recorder.records) == 1


async def test_passthrough_goes_to_baseline_and_is_not_measured(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.get("/v1/models") as resp:
        assert resp.status == 200
        assert await resp.read() == fixture_path("models.json").read_bytes()
        assert resp.headers["x-specproxy-arm"] == "baseline"
    assert arms.baseline.seen[-1]["path"] == "/v1/models"
    assert not proxy.recorder.records
    async with proxy.client.get("/admin") as resp:
        assert resp.status == 404


@pytest.mark.parametrize(
    "target",
    ["http://evil.example/v1/models", "/v1/../health", "/v1/%2e%2e/health", "/v1//x"],
)
async def test_never_an_open_proxy(arms: Arms, make_proxy: MakeProxy, target: str) -> None:
    proxy = await make_proxy()
    assert proxy.server.port is not None
    reader, writer = await asyncio.open_connection("127.0.0.1", proxy.server.port)
    writer.write(f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    status_line = await reader.readline()
    writer.close()
    await writer.wait_closed()
    assert status_line.split()[1] in (b"400", b"404")
    assert not arms.baseline.seen and not arms.speculative.seen


async def test_bad_bodies_get_openai_style_errors(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(max_body_bytes=1000)
    cases = [(b"{not json", 400), (b"[1, 2]", 400), (b'{"p": "' + b"x" * 2000 + b'"}', 413)]
    for raw, status in cases:
        async with proxy.client.post(CHAT, data=raw) as resp:
            assert resp.status == status
            error = (await resp.json())["error"]
            assert error["code"] == status and error["message"]
            assert resp.headers["x-specproxy-request-id"]
    assert not proxy.recorder.records


@pytest.mark.parametrize("stream", [False, True])  # the lean client and aiohttp's
async def test_headers_hop_by_hop_stripped_authorization_forwarded_never_logged(
    arms: Arms, make_proxy: MakeProxy, caplog: pytest.LogCaptureFixture, stream: bool
) -> None:
    caplog.set_level(logging.DEBUG)
    proxy = await make_proxy(routing=SPEC_ONLY)
    headers = {
        "Authorization": "Bearer sk-secret-123",
        "Connection": "keep-alive, X-Drop-Me",
        "X-Drop-Me": "1",
        "Keep-Alive": "timeout=5",
        "X-Keep-Me": "2",
        "User-Agent": "my-client/1.0",
    }
    async with proxy.client.post(CHAT, json=chat(stream=stream), headers=headers) as resp:
        await resp.read()
    seen = {k.lower(): v for k, v in arms.speculative.seen[-1]["headers"].items()}
    assert seen["authorization"] == "Bearer sk-secret-123"
    assert seen["x-keep-me"] == "2"
    assert "x-drop-me" not in seen and "keep-alive" not in seen
    assert seen["user-agent"] == "my-client/1.0"  # the client's, not the proxy's library's
    assert "sk-secret-123" not in caplog.text


@pytest.mark.parametrize("stream", [False, True])
async def test_the_proxy_overrides_its_own_headers_sent_by_the_upstream(
    make_proxy: MakeProxy, stream: bool
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    headers = {"x-fake-own-headers": "1"}
    async with proxy.client.post(CHAT, json=chat(stream=stream), headers=headers) as resp:
        await resp.read()
    assert resp.headers.getall("x-specproxy-arm") == ["speculative"]
    (request_id,) = resp.headers.getall("x-specproxy-request-id")
    assert request_id == proxy.recorder.records[-1].request_id
    assert resp.headers["x-fake-arm"] == "speculative"


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


def test_usage_of_decodes_only_the_small_objects() -> None:
    from specproxy.proxy.forward import _usage_of

    payload = fixture_path("chat_nonstream_spec.json").read_bytes()
    usage, speculative = _usage_of(payload)
    assert usage is not None and usage["completion_tokens"] == 32
    assert speculative is not None and speculative["num_spec_tokens"] == 4
    tricky = b'{"choices":[{"text":"usage"}],"usage":{"completion_tokens":3}}'
    assert _usage_of(tricky) == ({"completion_tokens": 3}, None)
    value_only = b'{"choices":[{"text":"x"}],"note":"usage"}'
    assert _usage_of(value_only) == (None, None)
    assert _usage_of(b'{"usage": null}') == (None, None)
    assert _usage_of(b"not json") == (None, None)


@pytest.mark.parametrize(
    "name",
    [
        "chat_nonstream_spec.json",
        "chat_nonstream_baseline.json",
        "completion_nonstream_spec.json",
        "completion_nonstream_baseline.json",
        "error_unknown_model.json",
        "models.json",
    ],
)
def test_usage_of_agrees_with_a_full_parse_on_the_real_bodies(name: str) -> None:
    from specproxy.proxy.forward import _usage_of

    payload = fixture_path(name).read_bytes()
    doc = json.loads(payload)
    metrics = doc.get("metrics") or {}
    expected = (doc.get("usage"), metrics.get("speculative_decoding"))
    assert _usage_of(payload) == expected
    spaced = json.dumps(doc, indent=2).encode()  # whitespace around every ':' and value
    assert _usage_of(spaced) == expected


def test_usage_of_takes_the_top_level_usage_after_nested_lookalikes() -> None:
    from specproxy.proxy.forward import _usage_of

    body = {
        "choices": [{"message": {"content": '"usage": {"completion_tokens": 99}'}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 5, "details": {"cached": 1}},
        "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5, "h": [1, 2]}},
    }
    usage, speculative = _usage_of(json.dumps(body).encode())
    assert usage == body["usage"]
    assert speculative == {"mean_acceptance_length": 2.5, "h": [1, 2]}
    assert _usage_of(b'{"usage": 5}') == (None, None)  # not an object: full parse, no usage
