"""HTTP/1.1 framing: the response-head splitter and the chunked decoder, what they return and
refuse, and the compiled ones equal to the references on every input, well formed or not."""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from specproxy.native import NO_EXTENSIONS_ENV
from specproxy.proxy.headers import RESPONSE_DROP
from specproxy.proxy.transports import wire as wire_module
from specproxy.proxy.transports.wire import (
    COMPILED,
    MAX_CHUNK_LINE,
    Head,
    py_split_head,
    py_take_chunked,
    split_head,
)

Split = Callable[[bytes, tuple[str, ...]], Head | None]
IMPLEMENTATIONS: dict[str, Split] = {"python": py_split_head}
if COMPILED:
    from specproxy.proxy.transports._wire import split_head as compiled

    IMPLEMENTATIONS["compiled"] = compiled

NGINX = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.22.1\r\nDate: Mon, 07 Dec 2026 13:41:28 GMT\r\n"
    b"Content-Type: text/event-stream\r\nContent-Length: 3000\r\nConnection: keep-alive"
)

CORPUS = [
    NGINX,
    b"HTTP/1.1 200 OK",
    b"HTTP/1.1 200",
    b"HTTP/1.1 200 ",
    b"HTTP/1.0 404 Not Found\r\nConnection: Keep-Alive",
    b"HTTP/1.1 200 OK\r\ntransfer-encoding: gzip, chunked\r\nTRANSFER-ENCODING: identity",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\ncontent-length: 6\r\nX: 1",
    b"HTTP/1.1 200 OK\r\nConnection: close\r\nConnection: keep-alive",
    b"HTTP/1.1 200 OK\r\nX-Empty:\r\nX-Spaces:   \t ",
    b"HTTP/1.1 200 OK\r\nA:\xa0b\x85 \x1c",  # latin-1 whitespace str.strip() removes
    b"HTTP/1.1 200 OK\r\nA: b\r",  # a lone CR stays in the value's line, then is stripped
    b"HTTP/1.1 200 OK\r\nA: b\nB: c",  # a bare LF does not end a line
    b"HTTP/1.1 200 OK\r\nConnexi\xf3n: close",
    b"HTTP/1.1 200 OK\r\nName:with:colons: v:w",
    b"HTTP/1.1 100 Continue",
    b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket",
    b"HTTP/1.1 199 whatever\r\nno colon",
    b"HTTP/1.1 099 low",
    b"HTTP/1.1 000 zero",
    b"HTTP/1.1 2x0 OK",
    b"HTTP/1.1 200OK",
    b"HTTP/1.1 20",
    b"HTTP/2 200 OK",
    b"SSH-2.0-OpenSSH",
    b"",
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here",
    b"HTTP/1.1 200 OK\r\n: no name",
    b"HTTP/1.1 200 OK\r\nName : space before the colon",
    b"HTTP/1.1 200 OK\r\nName\t: tab before the colon",
    b"HTTP/1.1 200 OK\r\n folded: line",
    b"HTTP/1.1 200 OK\r\n\tfolded: line",
    b"HTTP/1.1 200 OK\r\nA: b\r\n",
    b"HTTP/1.1 200 OK\r\n" + b"x" * 100,
    "HTTP/1.1 200 Ok\u00e9\r\nX-Caf\u00e9: \u00fcber".encode("latin-1"),
]


def outcome(split: Split, raw: bytes, drop: tuple[str, ...] = RESPONSE_DROP) -> object:
    try:
        return split(raw, drop)
    except ValueError as exc:
        return ("ValueError", str(exc))


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_a_well_formed_head(name: str) -> None:
    head = IMPLEMENTATIONS[name](NGINX, RESPONSE_DROP)
    server = ("Server", "nginx/1.22.1")
    date = ("Date", "Mon, 07 Dec 2026 13:41:28 GMT")
    content_type = ("Content-Type", "text/event-stream")
    assert head == (
        200,
        "OK",
        False,
        [server, date, content_type, ("Content-Length", "3000"), ("Connection", "keep-alive")],
        [server, date, content_type],  # the length and the hop-by-hop Connection stay behind
        "text/event-stream",
        "keep-alive",
        None,
        ["3000"],
    )


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_dropped_names_are_matched_in_any_case_and_nothing_else_is_dropped(name: str) -> None:
    raw = (
        b"HTTP/1.1 200 OK\r\nX-SpecProxy-Arm: other\r\ntransfer-ENCODING: chunked\r\n"
        b"X-Kept: 1\r\nKeep-Alive: timeout=5\r\nx-specproxy-request-id: abc\r\nTE: trailers"
    )
    head = IMPLEMENTATIONS[name](raw, RESPONSE_DROP)
    assert head is not None and head[4] == [("X-Kept", "1")]
    everything = IMPLEMENTATIONS[name](raw, ())
    assert everything is not None and everything[4] == everything[3]


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_framing_values_are_matched_in_any_case_first_or_all(name: str) -> None:
    split = IMPLEMENTATIONS[name]
    raw = b"HTTP/1.0 200 OK\r\nconnection: a\r\nCONNECTION: b\r\ncontent-LENGTH: 3"
    head = split(raw + b"\r\ncontent-type: text/plain\r\nContent-Type: x", ())
    assert head is not None
    status, reason, http10, _, _, content_type, connection, encoding, lengths = head
    assert (status, reason, http10, content_type) == (200, "OK", True, "text/plain")
    assert (connection, encoding, lengths) == ("a", None, ["3"])
    head = split(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\ntransfer-encoding: chunked", ())
    assert head is not None and head[7] == "gzip" and head[5] is None
    head = split(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length:  6 ", ())
    assert head is not None and head[8] == ["5", "6"]


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
def test_an_interim_response_is_none(name: str) -> None:
    assert IMPLEMENTATIONS[name](b"HTTP/1.1 100 Continue", ()) is None
    assert IMPLEMENTATIONS[name](b"HTTP/1.1 103 Early Hints\r\nLink: </a>", ()) is None


@pytest.mark.parametrize("name", sorted(IMPLEMENTATIONS))
@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"SSH-2.0-OpenSSH", "not an HTTP/1.x status line: 'SSH-2.0-OpenSSH'"),
        (b"HTTP/1.1 20", "not an HTTP/1.x status line: 'HTTP/1.1 20'"),
        (b"HTTP/1.1 2x0 OK", "bad status line: 'HTTP/1.1 2x0 OK'"),
        (b"HTTP/1.1 200OK", "bad status line: 'HTTP/1.1 200OK'"),
        (b"HTTP/1.1 099 low", "bad status code 99"),
        (b"HTTP/1.1 200 OK\r\nno colon", "bad header line: 'no colon'"),
        (b"HTTP/1.1 200 OK\r\n" + b"y" * 100, f"bad header line: {'y' * 40!r}"),
        (b"HTTP/1.1 200 OK\r\nA : b", "bad header line: 'A : b'"),
    ],
)
def test_malformed_heads_are_refused_with_what_is_wrong(
    name: str, raw: bytes, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        IMPLEMENTATIONS[name](raw, RESPONSE_DROP)
    assert str(info.value) == message


@pytest.mark.skipif(not COMPILED, reason="the compiled splitter is not built here")
@pytest.mark.parametrize("raw", CORPUS)
def test_the_compiled_splitter_equals_the_reference_on_the_corpus(raw: bytes) -> None:
    for drop in (RESPONSE_DROP, (), ("server", "a", "connection")):
        assert outcome(compiled, raw, drop) == outcome(py_split_head, raw, drop)


_HEAD_BYTES = st.sampled_from(
    [
        *(b"\r\n", b"\r", b"\n", b":", b" ", b"\t", b"\xa0", b"\x85", b"\x1f", b"a", b"Z", b"0"),
        *(b"-", b"Connection", b"content-length", b"Transfer-Encoding", b"close", b"chunked"),
        b"\xe9",
    ]
)


@pytest.mark.skipif(not COMPILED, reason="the compiled splitter is not built here")
@settings(max_examples=400, deadline=None)
@given(
    status=st.sampled_from([b"HTTP/1.1 200 OK", b"HTTP/1.0 204", b"HTTP/1.1 101 x", b"HTTP/1.1 2"]),
    tail=st.lists(_HEAD_BYTES, max_size=40).map(b"".join),
)
def test_the_compiled_splitter_equals_the_reference_on_generated_heads(
    status: bytes, tail: bytes
) -> None:
    for raw in (status + tail, status + b"\r\n" + tail, tail):
        assert outcome(compiled, raw) == outcome(py_split_head, raw)


def test_the_compiled_splitter_is_built_where_required() -> None:
    """`make test` (CI) installs with SPECPROXY_REQUIRE_EXTENSIONS=1: there the lean transport
    must split heads in C, and these tests must have run on both."""
    if os.environ.get("SPECPROXY_REQUIRE_EXTENSIONS") == "1":
        assert not os.environ.get(NO_EXTENSIONS_ENV)
        assert COMPILED and split_head is not py_split_head
        assert set(IMPLEMENTATIONS) == {"python", "compiled"}
    assert split_head(NGINX, RESPONSE_DROP) == py_split_head(NGINX, RESPONSE_DROP)


@pytest.mark.skipif(not COMPILED, reason="the compiled splitter is not built here")
def test_the_compiled_splitter_checks_its_arguments() -> None:
    with pytest.raises(TypeError):
        compiled("HTTP/1.1 200 OK", ())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        compiled(b"HTTP/1.1 200 OK", ("caf\u00e9",))
    with pytest.raises(TypeError):
        compiled(b"HTTP/1.1 200 OK", [])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- chunked bodies

Take = Callable[[bytearray, int], tuple[bytes, int, bool]]
TAKES: dict[str, Take] = {"python": py_take_chunked}
if COMPILED:
    from specproxy.proxy.transports._wire import take_chunked as compiled_take

    TAKES["compiled"] = compiled_take

BODIES = [
    b"5\r\nhello\r\n0\r\n\r\n",
    b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n",
    b"A; name=value\r\n0123456789\r\n0\r\nTrailer: x\r\nOther: y\r\n\r\n",
    b"  a \t\r\n0123456789\r\n0 ; last\r\n\r\n",
    b"1a3\r\n" + b"e" * 0x1A3 + b"\r\n0\r\n\r\n",
    b"0000000000000005\r\nhello\r\n0\r\n\r\n",  # 16 digits: the regex's longest
    b"00000000000000000005\r\nhello\r\n0\r\n\r\n",  # 20 digits: past the compiled parse
    b"5\r\nhelloXX",
    b"zz\r\n",
    b"0x5\r\nhello\r\n",
    b"+5\r\nhello\r\n",
    b"1_0\r\n",
    b";\r\n",
    b"\r\n",
    b"5\r\nhel",
    b"5" * 5000,
    b"5;" + b"e" * 5000 + b"\r\nhello\r\n0\r\n\r\n",
    b"2\r\nhi\r\n0\r\n",
    b"c\r\n" + "\u00e9t\u00e9 ok".encode("latin-1").ljust(12) + b"\r\n0\r\n\r\nafter",
]


def _drain(take: Take, body: bytes, cuts: list[int]) -> object:
    """Feed `body` in pieces ending at `cuts`, taking after each; every step's answer, or the
    error, and what was left unconsumed."""
    buf = bytearray()
    left = -1
    steps: list[object] = []
    for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True):
        buf += body[a:b]
        try:
            data, left, done = take(buf, left)
        except ValueError as exc:
            steps.append(("ValueError", str(exc)))
            return steps
        steps.append((data, left, done))
        if done:
            break
    steps.append(bytes(buf))
    return steps


@pytest.mark.parametrize("name", sorted(TAKES))
def test_a_chunked_body_is_decoded_and_consumed(name: str) -> None:
    take = TAKES[name]
    buf = bytearray(b"5\r\nhello\r\n6\r\n world\r\n0\r\nX-T: 1\r\n\r\nNEXT")
    assert take(buf, -1) == (b"hello world", -2, True)
    assert buf == b"NEXT"  # the next response's bytes stay
    buf = bytearray(b"5\r\nhel")
    assert take(buf, -1) == (b"hel", 2, False) and buf == b""
    buf += b"lo\r"
    assert take(buf, 2) == (b"lo", 0, False) and buf == b"\r"


@pytest.mark.parametrize("name", sorted(TAKES))
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"zz\r\n", "bad chunk size b'zz'"),
        (b"0x5\r\n", "bad chunk size b'0x5'"),
        (b" ;ext\r\n", "bad chunk size b''"),
        (b"5\r\nhelloXX", "chunk not followed by CRLF"),
        (b"5" * 5000, "chunk size line too long"),
    ],
)
def test_bad_chunked_framing_is_refused_with_what_is_wrong(
    name: str, body: bytes, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        TAKES[name](bytearray(body), -1)
    assert str(info.value) == message


def test_the_chunk_line_bound_is_the_same_number_in_c() -> None:
    source = (Path(wire_module.__file__).parent / "_wire.c").read_text()
    assert f"#define MAX_CHUNK_LINE {MAX_CHUNK_LINE} " in source


@pytest.mark.skipif(not COMPILED, reason="the compiled decoder is not built here")
@pytest.mark.parametrize("body", BODIES)
def test_the_compiled_decoder_equals_the_reference_cut_anywhere(body: bytes) -> None:
    for cut in range(len(body) + 1):
        cuts = [cut] if 0 < cut < len(body) else []
        assert _drain(compiled_take, body, cuts) == _drain(py_take_chunked, body, cuts)
    singles = list(range(1, min(len(body), 600)))
    assert _drain(compiled_take, body, singles) == _drain(py_take_chunked, body, singles)


@pytest.mark.skipif(not COMPILED, reason="the compiled decoder is not built here")
@settings(max_examples=300, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=40), max_size=6),
    ext=st.sampled_from([b"", b";a=b", b" ", b"\t;x"]),
    case=st.sampled_from([str.lower, str.upper]),
    noise=st.lists(st.sampled_from([b"\r", b"\n", b"x", b";", b" ", b"0"]), max_size=3),
    seed=st.integers(min_value=0, max_value=10**6),
)
def test_the_compiled_decoder_equals_the_reference_on_generated_bodies(
    sizes: list[int], ext: bytes, case: Callable[[str], str], noise: list[bytes], seed: int
) -> None:
    rng = random.Random(seed)
    body = b""
    for size in [*sizes, 0]:
        body += case(f"{size:x}").encode() + ext + b"\r\n"
        body += bytes(rng.randrange(256) for _ in range(size)) + (b"\r\n" if size else b"")
    body += b"\r\n"
    if noise:  # framing damaged somewhere
        at = rng.randrange(len(body))
        body = body[:at] + b"".join(noise) + body[at:]
    cuts = sorted(rng.sample(range(1, len(body)), min(len(body) - 1, rng.randint(0, 12))))
    assert _drain(compiled_take, body, cuts) == _drain(py_take_chunked, body, cuts)
