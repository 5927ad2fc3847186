"""The SSE scanner on the real vLLM fixtures, under arbitrary chunkings down to single bytes."""

from __future__ import annotations

import json
import random

import pytest

from specproxy.proxy.sse import SSEScanner, count_token_ids
from tests.proxy.fake_upstream import fixture_stream

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


def scan(chunks: list[bytes], *, strip: bool) -> tuple[SSEScanner, bytes]:
    scanner = SSEScanner(strip_usage=strip)
    out = [scanner.feed(chunk, float(i)) for i, chunk in enumerate(chunks)]
    out.append(scanner.finish())
    return scanner, b"".join(out)


@pytest.mark.parametrize("name", STREAMS)
def test_without_stripping_every_byte_passes_and_counts_do_not_depend_on_chunking(
    name: str,
) -> None:
    data = fixture_stream(name)
    results = set()
    for chunks in chunkings(data, seed=len(name)):
        scanner, out = scan(chunks, strip=False)
        assert out == data
        assert scanner.done
        usage = (scanner.usage or {}).get("completion_tokens")
        results.add((scanner.n_events, usage, scanner.token_ids_complete, scanner.token_ids))
    assert len(results) == 1


def test_chat_stream_counts_match_the_fixture() -> None:
    data = fixture_stream("chat_stream_usage_spec.sse")
    scanner, _ = scan([data], strip=False)
    # 13 data lines: role preamble (no content), 10 content events, usage chunk, [DONE].
    assert scanner.n_events == 10
    assert scanner.usage == {"prompt_tokens": 20, "total_tokens": 52, "completion_tokens": 32}
    assert scanner.speculative is not None
    assert scanner.speculative["mean_acceptance_length"] == pytest.approx(4.428571428571429)
    assert not scanner.token_ids_complete


def test_token_ids_are_counted_per_event() -> None:
    data = fixture_stream("completion_stream_usage_tokenids_spec.sse")
    scanner, _ = scan([data[i : i + 7] for i in range(0, len(data), 7)], strip=False)
    assert scanner.token_ids_complete
    assert scanner.usage is not None
    assert scanner.token_ids == scanner.usage["completion_tokens"] == 24
    assert scanner.n_events == 8


def test_stripping_the_usage_chunk_gives_exactly_the_no_usage_stream() -> None:
    with_usage = fixture_stream("chat_stream_usage_spec.sse")
    without = fixture_stream("chat_stream_nousage_spec.sse")
    for chunks in chunkings(with_usage, seed=11):
        scanner, out = scan(chunks, strip=True)
        assert out == without
        assert scanner.usage is not None and scanner.usage["completion_tokens"] == 32
        assert scanner.speculative is not None


def test_stripping_a_completion_stream_moves_the_fingerprint_like_vllm() -> None:
    data = fixture_stream("completion_stream_usage_tokenids_spec.sse")
    _, out = scan([data], strip=True)
    events = [e for e in out.split(b"\n\n") if e]
    assert b'"usage"' not in out
    assert events[-1] == b"data: [DONE]"
    finish = json.loads(events[-2][len(b"data: ") :])
    assert finish["choices"][0]["finish_reason"] == "length"
    assert finish["system_fingerprint"] == "vllm-0.32.0-6d623c34"
    assert list(finish)[-1] == "system_fingerprint"  # appended last, as vLLM serialises it
    assert out.count(b"\n\n") == data.count(b"\n\n") - 1


def test_stripping_without_a_usage_chunk_changes_nothing() -> None:
    data = fixture_stream("chat_stream_nousage_spec.sse")
    for chunks in chunkings(data, seed=5):
        _, out = scan(chunks, strip=True)
        assert out == data


def test_a_broken_stream_releases_its_incomplete_tail_verbatim() -> None:
    data = fixture_stream("chat_stream_usage_spec.sse")
    cut = data[: len(data) // 2 + 17]
    scanner, out = scan([cut[:100], cut[100:]], strip=True)
    assert out == cut
    assert not scanner.done


def test_timestamps_and_gaps_come_from_chunk_arrival() -> None:
    events = [
        b'data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"a"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"b"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{"content":"c"}}]}\n\n',
        b'data: {"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\n',
        b"data: [DONE]\n\n",
    ]
    scanner = SSEScanner()
    for at, event in zip([1.0, 2.0, 2.5, 4.0, 4.5, 4.6], events, strict=True):
        scanner.feed(event, at)
    assert scanner.first_content_at == 2.0
    assert scanner.last_content_at == 4.0
    assert scanner.gaps == [0.5, 1.5]
    assert scanner.n_events == 3
    assert scanner.last_event_at == 4.6


def test_crlf_framing_is_understood() -> None:
    data = fixture_stream("chat_stream_usage_spec.sse").replace(b"\n", b"\r\n")
    scanner, out = scan([data[i : i + 3] for i in range(0, len(data), 3)], strip=False)
    assert out == data
    assert scanner.n_events == 10 and scanner.done


def test_in_stream_error_is_flagged() -> None:
    scanner = SSEScanner()
    scanner.feed(b'data: {"error": {"message": "boom", "code": 500}}\n\ndata: [DONE]\n\n', 0.0)
    assert scanner.error_event and scanner.n_events == 0


def test_count_token_ids() -> None:
    assert count_token_ids(b'{"token_ids":[1,2,3]}') == 3
    assert count_token_ids(b'{"token_ids":[]}') == 0
    assert count_token_ids(b'{"token_ids":null}') is None
    assert count_token_ids(b'{"prompt_token_ids":[1,2],"token_ids":[5]}') == 1
    assert count_token_ids(b'[{"token_ids":[1]},{"token_ids":[2,3]}]') == 3


@pytest.mark.parametrize("name", STREAMS)
def test_a_complete_stream_has_no_defect(name: str) -> None:
    data = fixture_stream(name)
    for chunks in chunkings(data, seed=3)[:3]:
        scanner, _ = scan(chunks, strip=False)
        assert scanner.defect() is None
    unterminated = data.rstrip(b"\n")  # the last event without its blank line
    assert scan([unterminated], strip=False)[0].defect() is None


def test_garbage_a_cut_stream_and_an_in_stream_error_are_defects() -> None:
    rng = random.Random(5)
    garbage = bytes(rng.randrange(256) for _ in range(20_000)).replace(b"data:", b"dat?:")
    scanner, out = scan([garbage[i : i + 700] for i in range(0, len(garbage), 700)], strip=False)
    assert out == garbage and scanner.defect() == "malformed_stream"  # relayed as it came
    data = fixture_stream("chat_stream_usage_baseline.sse")
    cut = data[: data.rindex(b"data: [DONE]")]  # ends on an event boundary, without [DONE]
    assert scan([cut], strip=False)[0].defect() == "malformed_stream"
    error = b'data: {"error": {"message": "engine died", "code": 500}}\n\ndata: [DONE]\n\n'
    first = data[: data.index(b"\n\n", 300) + 2]  # whole events, then the error
    assert scan([first, error], strip=False)[0].defect() == "stream_error"


@pytest.mark.parametrize("strip", [False, True])
def test_an_event_past_the_bound_stops_the_scan(strip: bool) -> None:
    """Events below the bound are scanned as usual; one still open past it (here 100 KiB in
    1 KiB chunks, bound 16 KiB) marks the scanner oversized, is never held whole or parsed,
    and makes the stream `event_too_large`."""
    data = fixture_stream("chat_stream_usage_baseline.sse")
    events = [e + b"\n\n" for e in data.split(b"\n\n") if e]
    scanner = SSEScanner(strip_usage=strip, max_event_bytes=16 * 1024)
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
