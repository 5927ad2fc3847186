"""The SSE scanner on the real vLLM fixtures, under arbitrary chunkings down to single bytes."""

from __future__ import annotations

import json
import os
import random

import pytest

from specproxy.native import NO_EXTENSIONS_ENV
from specproxy.proxy.sse import (
    COMPILED,
    MAX_EVENT_BYTES,
    PySSEScanner,
    SSEScanner,
    count_token_ids,
)
from tests.proxy.fake_upstream import fixture_stream

# Every test runs on both scanners: the reference and the compiled one (when built; `make test`
# builds it, and test_the_compiled_scanner_is_built_where_required holds that).
IMPLEMENTATIONS: dict[str, type[PySSEScanner]] = {"python": PySSEScanner}
if COMPILED:
    IMPLEMENTATIONS["compiled"] = SSEScanner


@pytest.fixture(params=sorted(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> type[PySSEScanner]:
    return IMPLEMENTATIONS[request.param]


STREAMS = [
    "chat_stream_usage_spec.sse",
    "chat_stream_usage_baseline.sse",
    "chat_stream_nousage_spec.sse",
    "completion_stream_usage_tokenids_spec.sse",
    "completion_stream_n2_spec.sse",
]


def chunkings(data: bytes, seed: int) -> list[list[bytes]]:
    """Whole stream, one byte at a time, one event per chunk (how vLLM writes; the scanner's
    no-copy path), two events per chunk, and random splits (seeded)."""
    rng = random.Random(seed)
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    assert b"".join(events) == data
    pairs = [b"".join(events[i : i + 2]) for i in range(0, len(events), 2)]
    out = [[data], [data[i : i + 1] for i in range(len(data))], events, pairs]
    for _ in range(20):
        cuts = sorted(rng.sample(range(1, len(data)), rng.randint(1, 60)))
        out.append([data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)])
    return out


def scan(
    chunks: list[bytes], *, strip: bool, impl: type[PySSEScanner] = SSEScanner
) -> tuple[PySSEScanner, bytes]:
    scanner = impl(strip_usage=strip)
    out = [scanner.feed(chunk, float(i)) for i, chunk in enumerate(chunks)]
    out.append(scanner.finish())
    return scanner, b"".join(out)


@pytest.mark.parametrize("name", STREAMS)
def test_without_stripping_every_byte_passes_and_counts_do_not_depend_on_chunking(
    name: str, impl: type[PySSEScanner]
) -> None:
    data = fixture_stream(name)
    results = set()
    for chunks in chunkings(data, seed=len(name)):
        scanner, out = scan(chunks, strip=False, impl=impl)
        assert out == data
        assert scanner.done
        usage = (scanner.usage or {}).get("completion_tokens")
        results.add((scanner.n_events, usage, scanner.token_ids_complete, scanner.token_ids))
    assert len(results) == 1


def test_chat_stream_counts_match_the_fixture(impl: type[PySSEScanner]) -> None:
    data = fixture_stream("chat_stream_usage_spec.sse")
    scanner, _ = scan([data], strip=False, impl=impl)
    # 13 data lines: role preamble (no content), 10 content events, usage chunk, [DONE].
    assert scanner.n_events == 10
    assert scanner.usage == {"prompt_tokens": 20, "total_tokens": 52, "completion_tokens": 32}
    assert scanner.speculative is not None
    assert scanner.speculative["mean_acceptance_length"] == pytest.approx(4.428571428571429)
    assert not scanner.token_ids_complete


def test_token_ids_are_counted_per_event(impl: type[PySSEScanner]) -> None:
    data = fixture_stream("completion_stream_usage_tokenids_spec.sse")
    scanner, _ = scan([data[i : i + 7] for i in range(0, len(data), 7)], strip=False, impl=impl)
    assert scanner.token_ids_complete
    assert scanner.usage is not None
    assert scanner.token_ids == scanner.usage["completion_tokens"] == 24
    assert scanner.n_events == 8


def test_stripping_the_usage_chunk_gives_exactly_the_no_usage_stream(
    impl: type[PySSEScanner],
) -> None:
    with_usage = fixture_stream("chat_stream_usage_spec.sse")
    without = fixture_stream("chat_stream_nousage_spec.sse")
    for chunks in chunkings(with_usage, seed=11):
        scanner, out = scan(chunks, strip=True, impl=impl)
        assert out == without
        assert scanner.usage is not None and scanner.usage["completion_tokens"] == 32
        assert scanner.speculative is not None


def test_stripping_a_completion_stream_moves_the_fingerprint_like_vllm(
    impl: type[PySSEScanner],
) -> None:
    data = fixture_stream("completion_stream_usage_tokenids_spec.sse")
    _, out = scan([data], strip=True, impl=impl)
    events = [e for e in out.split(b"\n\n") if e]
    assert b'"usage"' not in out
    assert events[-1] == b"data: [DONE]"
    finish = json.loads(events[-2][len(b"data: ") :])
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["system_fingerprint"] == "vllm-0.32.0-6d623c34"
    assert list(finish)[-1] == "system_fingerprint"  # appended last, as vLLM serialises it
    assert out.count(b"\n\n") == data.count(b"\n\n") - 1


def test_stripping_without_a_usage_chunk_changes_nothing(impl: type[PySSEScanner]) -> None:
    data = fixture_stream("chat_stream_nousage_spec.sse")
    for chunks in chunkings(data, seed=5):
        _, out = scan(chunks, strip=True, impl=impl)
        assert out == data


def test_a_broken_stream_releases_its_incomplete_tail_verbatim(impl: type[PySSEScanner]) -> None:
    data = fixture_stream("chat_stream_usage_spec.sse")
    cut = data[: len(data) // 2 + 17]
    scanner, out = scan([cut[:100], cut[100:]], strip=True, impl=impl)
    assert out == cut
    assert not scanner.done


def test_timestamps_and_gaps_come_from_chunk_arrival(impl: type[PySSEScanner]) -> None:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"c"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    scanner = impl()
    for at, event in zip([1.0, 2.0, 2.5, 4.0, 4.5, 4.6], events, strict=True):
        scanner.feed(event, at)
    assert scanner.first_content_at == 2.0
    assert scanner.last_content_at == 4.0
    assert list(scanner.gaps) == [0.5, 1.5]
    assert scanner.n_events == 3
    assert scanner.last_event_at == 4.6


def test_crlf_framing_is_understood(impl: type[PySSEScanner]) -> None:
    data = fixture_stream("chat_stream_usage_spec.sse").replace(b"\n", b"\r\n")
    scanner, out = scan([data[i : i + 3] for i in range(0, len(data), 3)], strip=False, impl=impl)
    assert out == data
    assert scanner.n_events == 10 and scanner.done


def test_in_stream_error_is_flagged(impl: type[PySSEScanner]) -> None:
    scanner = impl()
    scanner.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n', 0.0)
    assert scanner.error_event and scanner.n_events == 0


def test_count_token_ids() -> None:
    assert count_token_ids(b'{"token_ids":[1,2,3]}') == 3
    assert count_token_ids(b'{"token_ids":[]}') == 0
    assert count_token_ids(b'{"token_ids":null}') is None
    assert count_token_ids(b'{"prompt_token_ids":[1,2],"token_ids":[5]}') == 1
    assert count_token_ids(b'[{"token_ids":[1]},{"token_ids":[2,3]}]') == 3


@pytest.mark.parametrize("name", STREAMS)
def test_a_complete_stream_has_no_defect(name: str, impl: type[PySSEScanner]) -> None:
    data = fixture_stream(name)
    for chunks in chunkings(data, seed=3)[:3]:
        scanner, _ = scan(chunks, strip=False, impl=impl)
        assert scanner.defect() is None
    unterminated = data.rstrip(b"\n")  # the last event without its blank line
    assert scan([unterminated], strip=False, impl=impl)[0].defect() is None


def test_garbage_a_cut_stream_and_an_in_stream_error_are_defects(impl: type[PySSEScanner]) -> None:
    rng = random.Random(5)
    garbage = bytes(rng.randrange(256) for _ in range(20_000)).replace(b"data:", b"dat?:")
    scanner, out = scan(
        [garbage[i : i + 700] for i in range(0, len(garbage), 700)], strip=False, impl=impl
    )
    assert out == garbage and scanner.defect() == "malformed_stream"  # relayed as it came
    data = fixture_stream("chat_stream_usage_baseline.sse")
    cut = data[: data.rindex(b"data: [DONE]")]  # ends on an event boundary, without [DONE]
    assert scan([cut], strip=False, impl=impl)[0].defect() == "malformed_stream"
    error = b'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n'
    first = data[: data.index(b"\n\n", 300) + 2]  # whole events, then the error
    assert scan([first, error], strip=False, impl=impl)[0].defect() == "stream_error"


@pytest.mark.parametrize("strip", [False, True])
def test_an_event_past_the_bound_stops_the_scan(strip: bool, impl: type[PySSEScanner]) -> None:
    """Events below the bound are scanned as usual; one still open past it (here 100 KiB in
    1 KiB chunks, bound 16 KiB) marks the scanner oversized, is never held whole or parsed,
    and makes the stream `event_too_large`."""
    data = fixture_stream("chat_stream_usage_baseline.sse")
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    scanner = impl(strip_usage=strip, max_event_bytes=16 * 1024)
    scanner.feed(events[0] + events[1], 1.0)
    assert scanner.n_events == 1 and scanner.defect() == "malformed_stream"  # no [DONE] yet
    scanner.feed(b'data: {"choices":[{"delta":{"content":"', 2.0)
    out = []
    for i in range(100):
        out.append(scanner.feed(b"x" * 1024, 3.0 + i))
        assert len(scanner._buf) <= 16 * 1024 + 1024
    assert scanner.defect() == "event_too_large" and not scanner._buf
    assert scanner.feed(b'"}}]}\n\n' + events[-1], 200.0) == (
        b"" if strip else b'"}}]}\n\n' + events[-1]
    )
    assert not scanner.done and scanner.n_events == 1  # nothing scanned past the bound
    assert scanner.oversized
    assert out == ([b""] * 100 if strip else [b"x" * 1024] * 100)


def test_the_compiled_scanner_is_built_where_required() -> None:
    """`make test` (CI) installs with SPECPROXY_REQUIRE_EXTENSIONS=1: there the relay must run
    the compiled scanner, and these tests must have run on both."""
    if os.environ.get("SPECPROXY_REQUIRE_EXTENSIONS") == "1":
        assert not os.environ.get(NO_EXTENSIONS_ENV)
        assert COMPILED and SSEScanner is not PySSEScanner
        assert set(IMPLEMENTATIONS) == {"python", "compiled"}
    assert SSEScanner().max_event_bytes == MAX_EVENT_BYTES == PySSEScanner().max_event_bytes


def _state(scanner: PySSEScanner) -> tuple[object, ...]:
    return (
        scanner.first_content_at,
        scanner.last_content_at,
        scanner.last_event_at,
        scanner.n_events,
        list(scanner.gaps),
        scanner.token_ids,
        scanner.token_ids_complete,
        scanner.usage,
        scanner.speculative,
        scanner.done,
        scanner.error_event,
        scanner.oversized,
        scanner.defect(),
        bytes(scanner._buf),
    )


# Events the generated streams are made of: every fixture's events, and the odd ones a server may
# send (comments, named events, multi-line data, no space after `data:`, empty content that is
# not, continuous usage stats on a content event, errors, unicode escapes, token id lists).
_ODD_EVENTS = [
    b": keep-alive",
    b'event: message\ndata: {"choices":[{"delta":{"content":"x"}}]}',
    b'data: {"choices":[{"delta":\ndata: {"content":"split"}}]}',
    b'data:{"choices":[{"delta":{"content":"nospace"}}]}',
    b'data: {"choices":[{"delta":{"content":"","tool_calls":[{"id":"t"}]}}]}',
    b'data: {"choices":[{"delta":{"content":"","reasoning_content":"think"}}]}',
    b'data: {"choices":[{"delta":{"content":null,"reasoning":""}}]}',
    b'data: {"choices":[{"delta":{"content": ""}, "finish_reason": "stop"}]}',
    b'data: {"choices":[{"delta":{}}],"note":"\\u0063ontent"}',
    b'data: {"choices":[{"delta":{"\\u0063ontent":"esc"}}]}',
    b'data: {"choices":[{"text":"","token_ids":[]}]}',
    b'data: {"choices":[{"text":"","token_ids":[ 7 , 8 ]}]}',
    b'data: {"choices":[{"text":"a","token_ids":[1,2,3]}],"token_ids":null}',
    b'data: {"choices":[{"delta":{"content":"u"}}],"usage":{"prompt_tokens":1}}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"fp-\\"q\\""}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":  "fp spaced"}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":null}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":7}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"fp\x01ctl"}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"fp-'
    + "\u00e9".encode()
    + b'"}',
    b'data: {"choices":[],"note":"' + "\u00e9".encode() + b'","usage":{"completion_tokens":3},'
    b'"system_fingerprint":"fp-ascii"}',
    b'data: {"choices":[],"usage":{"completion_tokens":3},"system_fingerprint":"unterminated',
    b'data: {"choices":[],"usage":null}',
    b'data: {"choices":[],"usage":{"prompt_tokens":2},"metrics":{"speculative_decoding":{"a":1}}}',
    b'data: {"error": {"message": "boom"}}',
    b'data: {"choices":[{"delta":{"content":"fin"},"finish_reason":"length"}]}',
    b"data: [DONE]",
    b"data: [DONE] ",
    b"data:[DONE]",
    b'data: {"choices":[{"delta":{"content":"","reasoning":"think"}}]}',
    b'data: {"choices":[{"delta":{"content":"","\\u0074ool_calls":[{"id":"t"}]}}]}',
    b'data: {"choices":[{"delta":{"content":""},"finish_reason":"stop"}]}',
    b'data: not json {"usage"',
    b'data: {"choices":[{"delta":{"content":"' + "\u00e9\u4e2d".encode() + b'"}}]}',
    b"\x00\xff garbage",
]


def _events_pool() -> list[bytes]:
    pool = list(_ODD_EVENTS)
    for name in STREAMS:
        pool += [e for e in fixture_stream(name).split(b"\n\n") if e]
    return pool


@pytest.mark.skipif(not COMPILED, reason="the compiled scanner is not built here")
@pytest.mark.parametrize("seed", range(60))
def test_the_compiled_scanner_equals_the_reference_on_generated_streams(seed: int) -> None:
    """Byte for byte and field for field, on random streams of odd and real events, framed with
    LF or CRLF, cut anywhere, with and without stripping, and with a small event bound."""
    rng = random.Random(seed)
    pool = _events_pool()
    crlf = rng.random() < 0.3
    sep = b"\r\n\r\n" if crlf else b"\n\n"
    events = [rng.choice(pool) for _ in range(rng.randint(0, 40))]
    if crlf:
        events = [e.replace(b"\n", b"\r\n") for e in events]
    data = b"".join(e + sep for e in events)
    if rng.random() < 0.3:
        data = data[: rng.randint(0, len(data))]  # cut mid-stream
    cuts = sorted(rng.sample(range(1, len(data)), min(max(len(data) - 1, 0), rng.randint(0, 30))))
    chunks = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]
    for strip in (False, True):
        bound = rng.choice([MAX_EVENT_BYTES, 300])
        ref, got = (
            PySSEScanner(strip_usage=strip, max_event_bytes=bound),
            SSEScanner(strip_usage=strip, max_event_bytes=bound),
        )
        for i, chunk in enumerate(chunks):
            assert got.feed(chunk, float(i)) == ref.feed(chunk, float(i))
            assert _state(got) == _state(ref)
        assert got.finish() == ref.finish()
        assert _state(got) == _state(ref)


@pytest.mark.parametrize("strip", [False, True])
def test_the_event_bound_is_exact(strip: bool, impl: type[PySSEScanner]) -> None:
    """An open event of exactly `max_event_bytes` is kept; one byte more is oversized."""
    for extra, oversized in ((0, False), (1, True)):
        scanner = impl(strip_usage=strip, max_event_bytes=64)
        scanner.feed(b"data: " + b"x" * (58 + extra), 1.0)
        assert scanner.oversized is oversized


@pytest.mark.parametrize(
    "tail", [b"data: [DONE]", b"data: [DONE]\n", b"data: [DONE]\r\n", b"data:[DONE]\r", b"[DONE]"]
)
def test_a_last_event_without_its_blank_line_still_ends_the_stream(
    tail: bytes, impl: type[PySSEScanner]
) -> None:
    scanner = impl()
    scanner.feed(b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n' + tail, 1.0)
    scanner.finish()
    assert scanner.done is (tail != b"[DONE]")


def test_a_finish_event_without_a_brace_gets_the_fingerprint_as_python_slices_it(
    impl: type[PySSEScanner],
) -> None:
    scanner = impl(strip_usage=True)
    out = scanner.feed(
        b'data: "finish_reason":"stop" no brace\n\n'
        b'data: {"choices":[],"usage":{"completion_tokens":1},"system_fingerprint":"fp"}\n\n',
        1.0,
    )
    assert out == b'data: "finish_reason":"stop" no brace\n,"system_fingerprint":"fp"\n'


@pytest.mark.parametrize(
    ("finish", "held"),
    [
        (b'"finish_reason":null},{"index":1,"finish_reason":"stop"}', True),  # a later choice
        (b'"finish_reason": null},{"index":1,"finish_reason": "length"}', True),
        (b'"finish_reason":null},{"index":1,"finish_reason":null}', False),
        (b'"finish_reason":  "stop"}', False),  # two spaces: not vLLM's, and not `_FINISHED`
        (b'"finish_reason":"stop"},{"finish_reason":', True),
        (b'"finish_reason":', False),  # the key ends the payload
    ],
)
def test_a_finish_event_is_held_whichever_choice_finishes(
    finish: bytes, held: bool, impl: type[PySSEScanner]
) -> None:
    """A content event is held for the usage chunk's fingerprint when any `finish_reason` of it
    holds a string (`"finish_reason":"` or `"finish_reason": "`), not only the first."""
    event = b'data: {"choices":[{"index":0,"delta":{"content":"x"},' + finish + b"]}\n\n"
    usage = b'data: {"choices":[],"usage":{"completion_tokens":1},"system_fingerprint":"fp"}\n\n'
    scanner = impl(strip_usage=True)
    first = scanner.feed(event, 1.0)
    assert first == (b"" if held else event)
    out = first + scanner.feed(usage, 2.0) + scanner.finish()
    with_fp = (
        event[: event.rindex(b"}")] + b',"system_fingerprint":"fp"' + event[event.rindex(b"}") :]
    )
    assert out == (with_fp if held else event)
    assert scanner.n_events == 1


@pytest.mark.skipif(not COMPILED, reason="the compiled scanner is not built here")
@pytest.mark.parametrize("run", [1, 63, 64, 65, 300])
@pytest.mark.parametrize("strip", [False, True])
@pytest.mark.parametrize("filler", [b"t", b"c", b"d", b"f", b"u", b"s", b"k", b"x", b"g", b"y"])
def test_keys_after_a_long_run_of_the_byte_they_are_searched_by_are_found_like_the_reference(
    run: int, strip: bool, filler: bytes
) -> None:
    """The compiled search looks for one byte of a key (its second, or a rarer one): text full
    of that byte makes a false candidate of every byte, and past a bound it searches the rest
    another way. Each key after such a run is still found, as the reference finds it."""
    text = filler * run
    events = [
        b'data: {"choices":[{"text":"' + text + b'","token_ids":[1,2,3]}]}',
        b'data: {"choices":[{"delta":{"content":"' + text + b'"}}],"x":{"content":""}}',
        b'data: {"choices":[{"delta":{"role":"' + text + b'","content":""}}]}',
        b'data: {"choices":[{"text":"' + text + b'"}],"more":{"text":""}}',
        b'data: {"choices":[{"delta":{"content":"' + text + b'"},"finish_reason":"stop"}]}',
        b'data: {"choices":[],"note":"' + text + b'","usage":{"completion_tokens":3},'
        b'"system_fingerprint":"' + text + b'"}',
        b"data: [DONE]",
    ]
    data = b"".join(e + b"\n\n" for e in events)
    ref, got = PySSEScanner(strip_usage=strip), SSEScanner(strip_usage=strip)
    assert got.feed(data, 1.0) == ref.feed(data, 1.0)
    assert got.finish() == ref.finish()
    assert _state(got) == _state(ref)
    assert got.token_ids == 3 and got.n_events == 4
    assert got.usage == {"completion_tokens": 3}


@pytest.mark.skipif(not COMPILED, reason="the compiled scanner is not built here")
def test_stripping_passes_a_verbatim_chunk_on_without_copying_it() -> None:
    """While stripping, events that pass unchanged leave as one piece of their chunk: a chunk
    that passes whole is returned itself, and adjacent events before a changed one are one
    bytes object, equal to the reference's output."""
    events = [e + b"\n\n" for e in fixture_stream("chat_stream_usage_spec.sse").split(b"\n\n") if e]
    scanner, ref = SSEScanner(strip_usage=True), PySSEScanner(strip_usage=True)
    for i, event in enumerate(events):
        out = scanner.feed(event, float(i))
        assert out == ref.feed(event, float(i))
        if out == event:
            assert out is event
    whole = b"".join(events)
    assert SSEScanner(strip_usage=True).feed(whole, 0.0) == PySSEScanner(strip_usage=True).feed(
        whole, 0.0
    )
