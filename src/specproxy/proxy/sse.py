"""Incremental scanner for OpenAI/vLLM server-sent events, fed raw upstream byte chunks.

The proxy forwards upstream bytes untouched; this scanner watches them on the side to timestamp
events and count tokens. Events end at a blank line (`\\n\\n`, or `\\r\\n\\r\\n` if the stream uses
CRLF) and may be split across chunks anywhere, down to single bytes. The hot path is byte search
only: JSON is parsed for the one usage chunk, and for the rare event that looks empty (the chat
role preamble, an empty finish delta) to decide whether it carries content.

When the proxy injected `stream_options.include_usage` on the client's behalf
(`strip_usage=True`), the scanner also rewrites what the client gets so it equals what vLLM
would have sent without usage: the usage event is dropped, and, because vLLM stamps
`system_fingerprint` on the finish chunks instead of the usage chunk when usage is off, the
usage chunk's raw fingerprint bytes are appended to each held finish event. Finish events are
held back only until the next event arrives (for n=1 the usage chunk follows at once).

One event is bounded (`max_event_bytes`, `Config.max_event_bytes`): an event still open past
the bound marks the scanner `oversized` and it stops scanning; the relay then ends the stream.

Two implementations of one state machine: `PySSEScanner` here, the reference, and the compiled
`_sse.Scanner` (`_sse.c`), which does each event's byte searches in one pass in C and calls back
into this module for the rare steps that parse JSON (`_usage_doc`, `_has_content`, `_raw_value`)
or join a multi-line event (`_data_payload`). `SSEScanner` is the compiled one when it was built
(`pip install` compiles it where a C compiler is found) and `SPECPROXY_NO_EXTENSIONS` is unset,
else the reference; tests run both on the same streams.
"""

from __future__ import annotations

import json
import re
from array import array
from typing import TYPE_CHECKING, Any, Final

from specproxy.errors import ErrorKind
from specproxy.native import compiled
from specproxy.proxy.usage import usage_of

__all__ = ["COMPILED", "MAX_EVENT_BYTES", "PySSEScanner", "SSEScanner", "count_token_ids"]

MAX_EVENT_BYTES = 1024 * 1024  # the default bound on one event (`Config.max_event_bytes`)

_DATA = b"data:"
_DATA_SPACE = b"data: "
_DONE = b"[DONE]"
_USAGE = b'"usage"'
_TOKEN_IDS = b'"token_ids":'
_FINISHED = (b'"finish_reason":"', b'"finish_reason": "')
_FINGERPRINT = b'"system_fingerprint":'
_ERROR = b'{"error"'
# Byte patterns of an event that may carry no generated text; such events get an exact JSON check.
# vLLM writes compact JSON; the spaced forms cover servers that use json.dumps defaults.
# One search for `"content":""`, `"text":""`, `"delta":{}` and `"content":null`, each also with a
# space after the colon.
_MAYBE_EMPTY = re.compile(rb'"content": ?(?:""|null)|"text": ?""|"delta": ?\{\}')
_NO_CHOICES = re.compile(rb'"choices": ?\[\]')
_CONTENT_KEYS = ("content", "text", "reasoning", "reasoning_content", "tool_calls", "token_ids")
_DECODER = json.JSONDecoder()


def count_token_ids(payload: bytes) -> int | None:
    """Sum of the lengths of every `"token_ids": [...]` list in an event; None if there is none."""
    total: int | None = None
    start = payload.find(_TOKEN_IDS)
    while start >= 0:
        begin = start + len(_TOKEN_IDS)
        while payload[begin : begin + 1] == b" ":
            begin += 1
        if payload[begin : begin + 1] == b"[":
            end = payload.find(b"]", begin)
            if end < 0:
                return total
            inner = payload[begin + 1 : end].strip()
            total = (total or 0) + (inner.count(b",") + 1 if inner else 0)
            begin = end
        start = payload.find(_TOKEN_IDS, begin)
    return total


def _has_content(payload: bytes) -> bool:
    """Exact check of a suspicious event: does any choice carry text, tool calls or tokens?"""
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return False
    choices = doc.get("choices") if isinstance(doc, dict) else None
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        for part in (choice, choice.get("delta")):
            if isinstance(part, dict) and any(part.get(key) for key in _CONTENT_KEYS):
                return True
    return False


def _usage_doc(payload: bytes) -> tuple[dict[str, Any], dict[str, Any] | None] | None:
    """The final usage chunk's `usage` and `metrics.speculative_decoding`, or None when the
    event is no usage chunk (`choices` not empty: continuous usage stats on a content event).

    vLLM's usage chunk (`"choices":[]`) is read as a non-stream body is (`usage.usage_of`: the
    two small objects decoded alone, not the chunk's per-request metrics around them); any
    other shape is parsed whole."""
    if _NO_CHOICES.search(payload) is not None:
        usage, speculative = usage_of(payload)
        return None if usage is None else (usage, speculative)
    try:
        doc = json.loads(payload)
    except (ValueError, RecursionError):
        return None
    usage = doc.get("usage") if isinstance(doc, dict) else None
    if not isinstance(usage, dict) or doc.get("choices"):
        return None
    metrics = doc.get("metrics")
    speculative = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return usage, speculative if isinstance(speculative, dict) else None


def _data_payload(event: bytes) -> bytes | None:
    """The joined `data:` field of one event (without the trailing blank line), if any."""
    if event.startswith(_DATA):
        if b"\n" not in event:
            payload = event[5:]
            return payload[1:] if payload.startswith(b" ") else payload
    elif _DATA not in event:
        return None
    parts = []
    for line in event.splitlines():
        if line.startswith(_DATA):
            value = line[5:]
            parts.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(parts) if parts else None


def _defect(scanner: PySSEScanner) -> ErrorKind | None:
    """Why a stream that ended normally (HTTP 200, clean EOF) is still no usable sample, as an
    `error_kind`: an in-stream error object ("stream_error"), or no `data: [DONE]`, which vLLM
    always sends last ("malformed_stream": garbage, or a stream cut at an event boundary), or an
    event past `max_event_bytes` ("event_too_large"). None for a complete stream."""
    if scanner.oversized:
        return ErrorKind.EVENT_TOO_LARGE
    if scanner.error_event:
        return ErrorKind.STREAM_ERROR
    if not scanner.done:
        return ErrorKind.MALFORMED_STREAM
    return None


class PySSEScanner:
    """Feed it every upstream chunk with its arrival time; read the results when the stream ends.

    The reference implementation (see the module's docstring)."""

    def __init__(
        self, *, strip_usage: bool = False, max_event_bytes: int = MAX_EVENT_BYTES
    ) -> None:
        self.strip_usage = strip_usage
        self.max_event_bytes = max_event_bytes
        self.oversized = False  # an event outgrew `max_event_bytes`: scanning stopped
        self.first_content_at: float | None = None
        self.last_content_at: float | None = None
        self.last_event_at: float | None = None
        self.n_events = 0  # events with content
        # between consecutive content events: 8 bytes each (a stream is bounded in time by
        # `stream_total_s`, so this is too)
        self.gaps: array[float] = array("d")
        self.token_ids = 0
        self.token_ids_complete = True  # every content event carried token_ids
        self.usage: dict[str, Any] | None = None
        self.speculative: dict[str, Any] | None = None
        self.done = False
        self.error_event = False  # upstream sent an in-stream error object
        self._buf = bytearray()
        self._scan_from = 0
        self._sep = b"\n\n"
        self._sep_known = False
        self._held: list[bytes] = []  # finish events awaiting the usage chunk's fingerprint
        self._out: list[bytes] = []

    def feed(self, chunk: bytes, now: float) -> bytes:
        """Scan one chunk; return the bytes the client should get (the chunk itself unless
        stripping usage). Once `oversized`, it scans nothing more."""
        if self.oversized:
            return b"" if self.strip_usage else chunk
        if not self._sep_known:
            self._detect_separator(chunk)
        sep = self._sep
        n = len(sep)
        event = self._event
        buf = self._buf
        if buf:  # an event began in an earlier chunk: scan on in the buffer
            buf += chunk
            start = 0
            end = buf.find(sep, self._scan_from)
            while end >= 0:
                stop = end + n
                event(bytes(buf[start:stop]), now)
                start = stop
                end = buf.find(sep, start)
            if start:
                del buf[:start]
        else:  # the usual case: events straight from the chunk, no copy into the buffer
            start = 0
            end = chunk.find(sep)
            while end >= 0:
                stop = end + n
                event(chunk[start:stop], now)
                start = stop
                end = chunk.find(sep, start)
            if start < len(chunk):
                buf += chunk[start:] if start else chunk
        self._scan_from = len(buf) - n + 1 if len(buf) >= n else 0
        if len(buf) > self.max_event_bytes:
            self.oversized = True  # the open event is dropped, never parsed
            buf.clear()
            self._scan_from = 0
        if not self.strip_usage:
            return chunk
        out = b"".join(self._out)
        self._out.clear()
        return out

    defect = _defect

    def finish(self) -> bytes:
        """End of the upstream stream: release held events and any incomplete tail verbatim."""
        if not self.done and _data_payload(bytes(self._buf).rstrip(b"\r\n")) == _DONE:
            self.done = True  # a last event without its blank line still ends the stream
        out = b"".join([*self._out, *self._held, bytes(self._buf)]) if self.strip_usage else b""
        self._out.clear()
        self._held.clear()
        self._buf.clear()
        return out

    def _detect_separator(self, chunk: bytes) -> None:
        newline = chunk.find(b"\n")
        if newline >= 0:
            self._sep_known = True
            if newline > 0 and chunk[newline - 1 : newline] == b"\r":
                self._sep = b"\r\n\r\n"

    def _event(self, event: bytes, now: float) -> None:
        self.last_event_at = now
        strip = self.strip_usage  # without stripping, events need no bookkeeping (`_emit`)
        body_end = len(event) - len(self._sep)
        if event.startswith(_DATA_SPACE) and event.find(b"\n", 0, body_end) < 0:
            payload: bytes | None = event[6:body_end]  # one `data: ` line: vLLM's every event
        else:
            payload = _data_payload(event[:body_end])
        if payload is None:
            if strip:
                self._emit(event)
            return
        if payload == _DONE:
            self.done = True
            if strip:
                self._emit(event)
            return
        if _USAGE in payload and self._usage_event(event, payload):
            return
        if payload.startswith(_ERROR):
            self.error_event = True
            if strip:
                self._emit(event)
            return
        tokens = count_token_ids(payload) if _TOKEN_IDS in payload else None
        if tokens is None:
            self.token_ids_complete = False
        if tokens or _MAYBE_EMPTY.search(payload) is None or _has_content(payload):
            last = self.last_content_at  # a content event: timed
            if last is None:
                self.first_content_at = now
            else:
                self.gaps.append(now - last)
            self.last_content_at = now
            self.n_events += 1
            if tokens:
                self.token_ids += tokens
        if not strip:
            return
        if (_FINISHED[0] in payload or _FINISHED[1] in payload) and _FINGERPRINT not in payload:
            self._held.append(event)
        else:
            self._emit(event)

    def _usage_event(self, event: bytes, payload: bytes) -> bool:
        """Handle the final usage chunk (`choices: []` plus `usage`); False if it is not one."""
        found = _usage_doc(payload)
        if found is None:
            return False
        self.usage, speculative = found
        if speculative is not None:
            self.speculative = speculative
        if not self.strip_usage:
            return True
        fingerprint = _raw_value(payload, _FINGERPRINT)
        for held in self._held:
            if fingerprint is not None:
                brace = held.rfind(b"}")
                held = held[:brace] + b"," + _FINGERPRINT + fingerprint + held[brace:]
            self._out.append(held)
        self._held.clear()
        return True

    def _emit(self, event: bytes) -> None:
        if self.strip_usage:
            if self._held:
                self._out.extend(self._held)
                self._held.clear()
            self._out.append(event)


def _raw_value(payload: bytes, key: bytes) -> bytes | None:
    """The raw JSON bytes of a top-level-ish `key` value (`"key":` included in `key`)."""
    at = payload.find(key)
    if at < 0:
        return None
    begin = at + len(key)
    while payload[begin : begin + 1] == b" ":
        begin += 1
    text = payload.decode("utf-8", "surrogatepass")
    char_begin = len(payload[:begin].decode("utf-8", "surrogatepass"))
    try:
        value, char_end = _DECODER.raw_decode(text, char_begin)
    except (ValueError, RecursionError):
        return None
    if value is None:
        return None
    return text[char_begin:char_end].encode("utf-8", "surrogatepass")


def _compiled() -> type[PySSEScanner] | None:
    """The compiled scanner with this module's hooks, if it was built and is not switched off."""
    if compiled("specproxy.proxy._sse", "Scanner") is None:
        return None
    from specproxy.proxy._sse import Scanner

    class SSEScanner(Scanner):
        __slots__ = ()
        defect = _defect
        _data_payload = staticmethod(_data_payload)
        _usage_doc = staticmethod(_usage_doc)
        _has_content = staticmethod(_has_content)
        _raw_value = staticmethod(_raw_value)

    SSEScanner.__module__ = __name__
    SSEScanner.__qualname__ = "SSEScanner"
    return SSEScanner  # type: ignore[return-value]  # same attributes, another base


_COMPILED = _compiled()
COMPILED: Final = _COMPILED is not None  # which scanner `SSEScanner` is

if TYPE_CHECKING:
    SSEScanner = PySSEScanner
else:
    SSEScanner = _COMPILED if _COMPILED is not None else PySSEScanner
