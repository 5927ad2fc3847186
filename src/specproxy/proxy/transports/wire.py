"""HTTP/1.1 framing for the lean transport: response heads, and chunked bodies.

Pure logic, no I/O.

`split_head(raw, drop)` takes the bytes before the blank line that ends a
head and returns `Head` parts, None for an interim (1xx) response, or raises ValueError naming
what is wrong. Header text is latin-1, as HTTP's is; each value is stripped of surrounding
whitespace. Besides every name/value pair, in order, it hands back the pairs whose name is not
in `drop` (lower-case names: those that cross to the client, `headers.RESPONSE_DROP`), the
first `Content-Type`, and the values that decide how the body is framed: the first
`Connection`, the first `Transfer-Encoding`, and every `Content-Length` (names matched in any
case, as a `CIMultiDict` lookup matches them: no other latin-1 letter cases to an ASCII one).

`take_chunked(buf, left)` decodes what `buf` (a bytearray the connection fills) holds of a
chunked body, from the state `left` an earlier call left (-1: a size line is next, -2: the
trailers, 0: the CRLF after a chunk's data, n > 0: n bytes of a chunk's data), and consumes it:
it returns the data, the new state and whether the body ended, or raises ValueError for framing
that is wrong (a size line too long or not hex, data not followed by CRLF).

Each has two implementations: the reference here (`py_split_head`, `py_take_chunked`), and the
compiled one in `_wire.c`, which scans the bytes once in C and makes only the objects kept. The
names without `py_` are the compiled ones when they were built and `SPECPROXY_NO_EXTENSIONS` is
unset, else the references; tests run both on the same bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final, TypeAlias

from specproxy.native import compiled

__all__ = [
    "COMPILED",
    "MAX_CHUNK_LINE",
    "Head",
    "py_split_head",
    "py_take_chunked",
    "split_head",
    "take_chunked",
]

MAX_CHUNK_LINE: Final = 4096  # a chunk size line (with extensions) longer than this is refused
_HEX_DIGITS: Final = b"0123456789abcdefABCDEF"
_SIZE_LINE: Final = re.compile(rb"([0-9a-fA-F]{1,16})\r\n")

# status, reason, HTTP/1.0, name/value pairs, the pairs not dropped, first Content-Type, first
# Connection, first Transfer-Encoding, every Content-Length
Head: TypeAlias = tuple[
    int,
    str,
    bool,
    list[tuple[str, str]],
    list[tuple[str, str]],
    str | None,
    str | None,
    str | None,
    list[str],
]


def py_split_head(raw: bytes, drop: tuple[str, ...] = ()) -> Head | None:
    """The reference: `raw`'s parts, None for a 1xx, ValueError for a malformed head."""
    text = raw.decode("latin-1")  # one decode for the whole head; HTTP headers are latin-1
    status_line, _, rest = text.partition("\r\n")
    if not status_line.startswith(("HTTP/1.1 ", "HTTP/1.0 ")) or len(status_line) < 12:
        raise ValueError(f"not an HTTP/1.x status line: {status_line[:40]!r}")
    code = status_line[9:12]
    if not (code.isascii() and code.isdigit()) or status_line[12:13] not in ("", " "):
        raise ValueError(f"bad status line: {status_line[:40]!r}")
    status = int(code)
    if status < 100:
        raise ValueError(f"bad status code {status}")
    if status < 200:
        return None
    pairs = []
    forward = []
    content_type = connection = encoding = None
    lengths = []
    if rest:
        for line in rest.split("\r\n"):
            name, colon, value = line.partition(":")
            if not colon or not name or name[-1] in " \t" or name[0] in " \t":
                raise ValueError(f"bad header line: {line[:40]!r}")
            pair = (name, value.strip())
            pairs.append(pair)
            key = name.lower() if name.isascii() else ""
            if key not in drop:
                forward.append(pair)
            if key == "content-type":
                content_type = pair[1] if content_type is None else content_type
            elif key == "connection":
                connection = pair[1] if connection is None else connection
            elif key == "transfer-encoding":
                encoding = pair[1] if encoding is None else encoding
            elif key == "content-length":
                lengths.append(pair[1])
    http10 = status_line[7] == "0"
    reason = status_line[13:]
    return status, reason, http10, pairs, forward, content_type, connection, encoding, lengths


def py_take_chunked(buf: bytearray, left: int) -> tuple[bytes, int, bool]:
    """The reference: decode and consume what `buf` holds of a chunked body from state `left`;
    (data, state, ended)."""
    out: list[bytes] = []
    pos = 0
    done = False
    size_of = len(buf)
    view = memoryview(buf)
    try:
        while True:
            if left == -1:  # expecting a size line
                plain = _SIZE_LINE.match(buf, pos)  # the usual bare `1a3\r\n`
                if plain is not None:
                    size = int(plain.group(1), 16)
                    pos = plain.end()
                else:
                    end = buf.find(b"\r\n", pos)
                    if end < 0:
                        if size_of - pos > MAX_CHUNK_LINE:
                            raise ValueError("chunk size line too long")
                        break
                    size_text = bytes(view[pos:end]).split(b";", 1)[0].strip()
                    if not size_text or size_text.strip(_HEX_DIGITS):
                        raise ValueError(f"bad chunk size {size_text[:20]!r}")
                    size = int(size_text, 16)
                    pos = end + 2
                left = -2 if size == 0 else size  # after the last chunk: trailers
            if left == -2:  # trailers, up to an empty line
                end = buf.find(b"\r\n", pos)
                if end < 0:
                    break
                last = end == pos
                pos = end + 2
                if last:
                    done = True
                    break
                continue
            if left > 0:
                n = min(left, size_of - pos)
                if not n:
                    break
                out.append(bytes(view[pos : pos + n]))
                pos += n
                left -= n
                if left:
                    break
            # chunk data complete: its CRLF
            if size_of - pos < 2:
                left = 0
                break
            if not buf.startswith(b"\r\n", pos):
                raise ValueError("chunk not followed by CRLF")
            pos += 2
            left = -1
    finally:
        view.release()
    if pos:
        del buf[:pos]
    return (out[0] if len(out) == 1 else b"".join(out)), left, done


_SPLIT: Callable[[bytes, tuple[str, ...]], Head | None] | None = compiled(
    "specproxy.proxy.transports._wire", "split_head"
)
_TAKE: Callable[[bytearray, int], tuple[bytes, int, bool]] | None = compiled(
    "specproxy.proxy.transports._wire", "take_chunked"
)
COMPILED: Final = _SPLIT is not None and _TAKE is not None  # which ones the names below are
split_head: Final[Callable[[bytes, tuple[str, ...]], Head | None]] = (
    _SPLIT if _SPLIT is not None else py_split_head
)
take_chunked: Final[Callable[[bytearray, int], tuple[bytes, int, bool]]] = (
    _TAKE if _TAKE is not None else py_take_chunked
)
