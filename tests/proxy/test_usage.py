"""Usage injection (only when it changes nothing else) and reading usage from bodies."""

from __future__ import annotations

import json
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproxy.native import NO_EXTENSIONS_ENV
from specproxy.proxy import usage as usage_module
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


# --------------------------------------------------------------------------- the compiled twin

if usage_module._COMPILED is not None:
    _compiled_after = usage_module._COMPILED


def _reference(payload: bytes, key: bytes) -> object:
    """The reference's answer in the compiled one's terms: the value, or the outcome's name."""
    value = usage_module.py_object_after(payload, key)
    if value is usage_module._NOT_FOUND:
        return "not found"
    if value is usage_module._UNSURE:
        return "unsure"
    return ("value", value)


def _compiled(payload: bytes, key: bytes) -> object:
    """The compiled answer, with what it leaves to the reference decided by the reference."""
    outcome, value = _compiled_after(payload, key)
    if outcome == 3:
        assert value is None
        return _reference(payload, key)
    return ("not found", "unsure", ("value", value))[outcome]


_KEYS = (b'"usage"', b'"speculative_decoding"')
_TRICKY = [
    b'{"usage": null}',
    b'{"usage":nul}',
    b'{"usage" :\x0b {"a": 1}}',
    b'{"usage": {"a": 1, "a": 2, "b": [1, 2.5, -0, 1e3, 1E-2, -3.25e+2, true, false, null]}}',
    b'{"usage": {"a": 01}}',
    b'{"usage": {"a": 1.}}',
    b'{"usage": {"a": .5}}',
    b'{"usage": {"a": NaN, "b": Infinity}}',
    b'{"usage": {"a": -Infinity}}',
    b'{"usage": {"a": "caf\\u00e9", "b": "tab\\t"}}',
    '{"usage": {"a": "caf\u00e9"}}'.encode(),
    b'{"usage": {"a": "ctl\x01"}}',
    b'{"usage": {"a": 1,}}',
    b'{"usage": {"a" 1}}',
    b'{"usage": {"a": 1',
    b'{"usage": {"a": [1, 2}}',
    b'{"usage": {"a": {"b": {"c": {"d": {"e": 1}}}}}}',
    b'{"usage": {"a": 123456789012345678901234567890123456789012345678901234567890}}',
    b'{"usage": {"a": 1e400, "b": -1e-400}}',
    b'{"usage": {}} {"usage": [1]}',
    b'{"usage": "text"}',
    b'{"usage": 5}',
    b'{"usage"',
    b'"usage": {"x": 1}',
    b'{"speculative_decoding": {"mean_acceptance_length": 4.428571428571429}}',
    b"",
]


@pytest.mark.skipif(usage_module._COMPILED is None, reason="the compiled reader is not built here")
@pytest.mark.parametrize("payload", _TRICKY)
def test_the_compiled_reader_equals_the_reference_on_tricky_json(payload: bytes) -> None:
    for key in _KEYS:
        assert _compiled(payload, key) == _reference(payload, key)


@pytest.mark.skipif(usage_module._COMPILED is None, reason="the compiled reader is not built here")
def test_the_compiled_reader_equals_the_reference_on_every_fixture() -> None:
    paths = sorted(fixture_path("chat_stream_usage_spec.sse").parent.iterdir())
    bodies = [p.read_bytes() for p in paths if p.suffix in (".json", ".sse")]
    assert len(bodies) > 5
    for body in bodies:
        for key in _KEYS:
            assert _compiled(body, key) == _reference(body, key)
    decoded = [_compiled_after(b, k) for b in bodies for k in _KEYS]
    assert any(outcome == 2 for outcome, _ in decoded)  # vLLM's own objects are decoded in C


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(alphabet=st.characters(max_codepoint=0x7F), max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(alphabet='abcu_"\\é', max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.skipif(usage_module._COMPILED is None, reason="the compiled reader is not built here")
@settings(max_examples=300, deadline=None)
@given(
    value=st.dictionaries(st.text(alphabet="abcu_", max_size=5), _JSON, max_size=5) | _JSON,
    spaced=st.booleans(),
    cut=st.integers(min_value=0, max_value=400),
)
def test_the_compiled_reader_equals_the_reference_on_generated_json(
    value: object, spaced: bool, cut: int
) -> None:
    """Objects mostly (what the reader decodes), any JSON value, and each cut short."""
    text = json.dumps(value, separators=(", ", ": ") if spaced else (",", ":"))
    payload = ('{"usage":' + text + ',"metrics":{"speculative_decoding":' + text + "}}").encode()
    for body in (payload, payload[:cut]):
        for key in _KEYS:
            assert _compiled(body, key) == _reference(body, key)


def test_the_compiled_reader_is_built_where_required() -> None:
    """`make test` (CI) installs with SPECPROXY_REQUIRE_EXTENSIONS=1: there usage is read in C."""
    if os.environ.get("SPECPROXY_REQUIRE_EXTENSIONS") == "1":
        assert not os.environ.get(NO_EXTENSIONS_ENV)
        assert usage_module._COMPILED is not None
