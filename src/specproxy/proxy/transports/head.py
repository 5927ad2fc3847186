"""An HTTP/1.x response head (status line and header lines) split into the parts a client needs.

Pure logic, no I/O: `split_head(raw, drop)` takes the bytes before the blank line that ends a
head and returns `Head` parts, None for an interim (1xx) response, or raises ValueError naming
what is wrong. Header text is latin-1, as HTTP's is; each value is stripped of surrounding
whitespace. Besides every name/value pair, in order, it hands back the pairs whose name is not
in `drop` (lower-case names: those that cross to the client, `headers.RESPONSE_DROP`), the
first `Content-Type`, and the values that decide how the body is framed: the first
`Connection`, the first `Transfer-Encoding`, and every `Content-Length` (names matched in any
case, as a `CIMultiDict` lookup matches them: no other latin-1 letter cases to an ASCII one).

Two implementations of one function: `py_split_head` here, the reference, and the compiled
`_head.split_head` (`_head.c`), which scans the head once in C and makes only the objects kept.
`split_head` is the compiled one when it was built and `SPECPROXY_NO_EXTENSIONS` is unset, else
the reference; tests run both on the same heads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeAlias

from specproxy.native import compiled

__all__ = ["COMPILED", "Head", "py_split_head", "split_head"]

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


_COMPILED: Callable[[bytes, tuple[str, ...]], Head | None] | None = compiled(
    "specproxy.proxy.transports._head", "split_head"
)
COMPILED: Final = _COMPILED is not None  # which one `split_head` is
split_head: Final[Callable[[bytes, tuple[str, ...]], Head | None]] = (
    _COMPILED if _COMPILED is not None else py_split_head
)
