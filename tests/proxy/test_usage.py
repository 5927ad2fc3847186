"""Usage injection (only when it changes nothing else) and reading usage from bodies."""

from __future__ import annotations

import json

import pytest

from specproxy.proxy.usage import usage_of, with_usage
from tests.conftest import fixture_path
from tests.proxy.conftest import CHAT, COMPLETIONS, SPEC_ONLY, Arms, MakeProxy
from tests.proxy.fake_upstream import fixture_stream


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


async def test_n2_stream_is_not_injected_and_passes_verbatim(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    body = {"model": "tiny-llama", "prompt": "x", "stream": True, "n": 2}
    async with proxy.client.post(COMPLETIONS, json=body, headers={"x-fake-chunk": "1"}) as resp:
        got = await resp.read()
    assert got == fixture_stream("completion_stream_n2_spec.sse")
    assert "stream_options" not in arms.speculative.seen[-1]["body"]


def testusage_of_decodes_only_the_small_objects() -> None:
    payload = fixture_path("chat_nonstream_spec.json").read_bytes()
    usage, speculative = usage_of(payload)
    assert usage is not None and usage["completion_tokens"] == 32
    assert speculative is not None and speculative["num_spec_tokens"] == 4
    tricky = b'{"choices":[{"text":"usage"}],"usage":{"completion_tokens":3}}'
    assert usage_of(tricky) == ({"completion_tokens": 3}, None)
    value_only = b'{"choices":[{"text":"x"}],"note":"usage"}'
    assert usage_of(value_only) == (None, None)
    assert usage_of(b'{"usage": null}') == (None, None)
    assert usage_of(b"not json") == (None, None)


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
def testusage_of_agrees_with_a_full_parse_on_the_real_bodies(name: str) -> None:
    payload = fixture_path(name).read_bytes()
    doc = json.loads(payload)
    metrics = doc.get("metrics") or {}
    expected = (doc.get("usage"), metrics.get("speculative_decoding"))
    assert usage_of(payload) == expected
    spaced = json.dumps(doc, indent=2).encode()  # whitespace around every ':' and value
    assert usage_of(spaced) == expected


def testusage_of_takes_the_top_level_usage_after_nested_lookalikes() -> None:
    body = {
        "choices": [{"message": {"content": '"usage": {"completion_tokens": 99}'}}],
        "usage": {"prompt_tokens": 2, "completion_tokens": 5, "details": {"cached": 1}},
        "metrics": {"speculative_decoding": {"mean_acceptance_length": 2.5, "h": [1, 2]}},
    }
    usage, speculative = usage_of(json.dumps(body).encode())
    assert usage == body["usage"]
    assert speculative == {"mean_acceptance_length": 2.5, "h": [1, 2]}
    assert usage_of(b'{"usage": 5}') == (None, None)  # not an object: full parse, no usage


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}',
        b' {\n  "model": "m",\n  "stream": true,\n  "prompt": "}"\n}\n',
        b'{"stream":true,"stream_options":null}',
        b'{"stream":true,"stream_options":{"include_usage":false,"x":1}}',
        '{"stream":true,"prompt":"é"}'.encode("utf-16"),
    ],
)
def test_with_usage_sets_the_option_and_keeps_everything_else(body: bytes) -> None:
    doc = json.loads(body)
    got = with_usage(doc, body)
    options = dict(doc.get("stream_options") or {})
    assert json.loads(got) == {**doc, "stream_options": {**options, "include_usage": True}}
    if "stream_options" not in doc and body.lstrip().startswith(b"{"):
        assert got.startswith(body.rstrip()[:-1])  # the client's own bytes, key appended
