"""Bounds on what a client controls, checked before anything is forwarded (pure, no I/O).

Every client-controllable input of the proxied routes has a stated limit (README, "Limits"):

    body size       `max_body_bytes` (config, 32 MiB)           -> 413
    JSON nesting    MAX_JSON_DEPTH levels (the body's arrays
                    and objects, the top level counting 1)      -> 400
    header bytes    MAX_HEADER_BYTES, names + values summed     -> 431
    header count    MAX_HEADERS                                 -> 431
    one line        MAX_FIELD_BYTES (header or request line)   -> 431 / 414 JSON
    parser          aiohttp's parser: PARSER_MAX_LINE_BYTES a
                    line, PARSER_MAX_HEADERS lines              -> 400 (aiohttp's own answer)
    method          ALLOWED_METHODS on /v1/* (what vLLM serves;
                    TRACE, PUT, DELETE, PATCH, OPTIONS, ...)    -> 405 with Allow
    model string    `records.MODEL_MAX_BYTES` bytes are stored (the request is still forwarded)

Deep JSON: `json.loads` is C code that raises `RecursionError` near the interpreter's recursion
limit, and anything that walks a parsed document deep enough (re-serializing it to inject the
usage option, for one) fails the same way. So the parse error is caught and the parsed document
is bounded far below that limit. The bound costs nothing for usual bodies: a document cannot nest
deeper than it has `[` and `{`, and counting those is a C-speed byte scan; only a body with more
brackets than the bound is walked (iteratively, stopping at the first level past the bound).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from typing import Any, Final

from aiohttp.http_exceptions import HttpProcessingError

__all__ = [
    "ALLOWED_METHODS",
    "ALLOW_HEADER",
    "MAX_FIELD_BYTES",
    "MAX_HEADERS",
    "MAX_HEADER_BYTES",
    "MAX_JSON_DEPTH",
    "PARSER_MAX_HEADERS",
    "PARSER_MAX_LINE_BYTES",
    "Rejection",
    "header_rejection",
    "json_too_deep",
    "quiet_parser_rejections",
]

MAX_JSON_DEPTH: Final = 128  # vLLM bodies nest < 10; a tool's JSON schema rarely passes 20
MAX_HEADER_BYTES: Final = 64 * 1024  # nginx: 4 x 8 KiB buffers by default; Node.js: 16 KiB
MAX_HEADERS: Final = 100  # Apache's LimitRequestFields
MAX_FIELD_BYTES: Final = 64 * 1024  # one header line or the request line (the proxy's bound)
# aiohttp's parser bound on one line (app.py: max_line_size, max_field_size), twice the proxy's
# so a line up to it reaches the JSON 431 with a request id; only past it is aiohttp's plain 400.
PARSER_MAX_LINE_BYTES: Final = 2 * MAX_HEADER_BYTES
PARSER_MAX_HEADERS: Final = 128  # header lines aiohttp's parser reads at all (its 400 beyond)
ALLOWED_METHODS: Final = frozenset({"GET", "HEAD", "POST"})  # what vLLM serves on /v1/*
ALLOW_HEADER: Final = ", ".join(sorted(ALLOWED_METHODS))


class Rejection(enum.StrEnum):
    """Why the proxy answered a request itself: the `reason` label of the rejection counter."""

    INVALID_JSON = "invalid_json"
    JSON_TOO_DEEP = "json_too_deep"
    BODY_TOO_LARGE = "body_too_large"
    HEADERS_TOO_LARGE = "headers_too_large"
    METHOD_NOT_ALLOWED = "method_not_allowed"


class _ParserRejections(logging.Filter):
    """aiohttp logs each request its HTTP parser rejects (an unknown method, a line too long, a
    bad header: the client's error, already answered 400) with a full traceback, so a hostile
    client could fill the log with them. Such a record becomes one DEBUG line without one."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        _log.debug("HTTP parser rejected a request: %s", str(exc).splitlines()[0])
        return False


_log = logging.getLogger(__name__)
_PARSER_FILTER: Final = _ParserRejections()


def quiet_parser_rejections() -> None:
    """Install the filter on aiohttp's server logger (once per process; idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if _PARSER_FILTER not in logger.filters:
        logger.addFilter(_PARSER_FILTER)


def header_rejection(raw_headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """Why the request's headers pass a bound (the message of a 431), or None when they fit."""
    count = 0
    size = 0
    for name, value in raw_headers:
        count += 1
        size += len(name) + len(value)
    if count > MAX_HEADERS:
        return f"request has {count} header fields; the proxy's limit is {MAX_HEADERS}"
    if size > MAX_HEADER_BYTES:
        return f"request headers total {size} bytes; the proxy's limit is {MAX_HEADER_BYTES}"
    return None


def json_too_deep(body: bytes, doc: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the parsed `doc` (parsed from `body`) nests arrays/objects deeper than `limit`."""
    if not isinstance(doc, (dict, list)) or body.count(b"[") + body.count(b"{") <= limit:
        return False  # cannot nest deeper than it has openers (strings may hold some: fine)
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        children = node.values() if isinstance(node, dict) else node
        for child in children:
            if isinstance(child, (dict, list)):
                if depth + 1 > limit:
                    return True
                stack.append((child, depth + 1))
    return False
