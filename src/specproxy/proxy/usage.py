"""Usage accounting the client did not ask for: injecting `include_usage`, reading usage back.

For streams, the proxy asks the upstream for the final usage chunk on the client's behalf when
that changes nothing else the client sees (`should_inject`, `with_usage`); the scanner
(`sse.SSEScanner(strip_usage=True)`) removes that chunk again on the way back. For non-stream
bodies, `usage_of` reads `usage` and `metrics.speculative_decoding` without parsing the whole
(possibly large) body.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any, Final

from specproxy.native import compiled

__all__ = ["should_inject", "usage_of", "with_usage"]

_DECODER = json.JSONDecoder()
_INCLUDE_USAGE: Final = b',"stream_options":{"include_usage":true}'


def should_inject(doc: Mapping[str, Any]) -> bool:
    """Ask upstream for usage on the client's behalf? Only when it changes nothing else."""
    options = doc.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or options.get("include_usage") is True:
            return False
        if options.get("continuous_usage_stats"):
            return False  # usage would then appear in every chunk
    return doc.get("n") in (None, 1)


def with_usage(doc: Mapping[str, Any], body: bytes | None = None) -> bytes:
    """The request body with `stream_options.include_usage` set.

    When the client sent no `stream_options` and `body` is the plain UTF-8 object `doc` was
    parsed from, the key is appended to the client's own bytes (no re-encoding of a body that
    can be large); otherwise `doc` is re-encoded with the option merged in.
    """
    if body is not None and doc and "stream_options" not in doc:
        stripped = body.rstrip()
        if stripped.endswith(b"}") and body.lstrip().startswith(b"{"):
            return stripped[:-1] + _INCLUDE_USAGE + b"}"
    changed = dict(doc)
    options = dict(doc.get("stream_options") or {})
    options["include_usage"] = True
    changed["stream_options"] = options
    return json.dumps(changed, ensure_ascii=False, separators=(",", ":")).encode()


def usage_of(payload: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """`usage` and `metrics.speculative_decoding` of a non-streaming body, if present.

    Only those two small objects are decoded (the body can be large); a key that is not
    followed by an object falls back to parsing the whole body.
    """
    usage = _object_after(payload, b'"usage"')
    speculative = _object_after(payload, b'"speculative_decoding"')
    if usage is _NOT_FOUND and speculative is _NOT_FOUND:
        return None, None
    if usage is _UNSURE or speculative is _UNSURE:
        try:
            doc = json.loads(payload)
        except ValueError:
            return None, None
        if not isinstance(doc, dict):
            return None, None
        usage = doc.get("usage")
        metrics = doc.get("metrics")
        speculative = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return (
        usage if isinstance(usage, dict) else None,
        speculative if isinstance(speculative, dict) else None,
    )


_NOT_FOUND: Final = object()
_UNSURE: Final = object()


# The compiled `_object_after` (`_usage.c`) for plain JSON: (outcome, value) with outcome 0 (not
# found), 1 (unsure), 2 (value) or 3 (left to the reference below, which then decides).
_COMPILED: Callable[[bytes, bytes], tuple[int, Any]] | None = compiled(
    "specproxy.proxy._usage", "object_after"
)
_OUTCOMES: Final = (_NOT_FOUND, _UNSURE)


def _object_after(payload: bytes, key: bytes) -> object:
    """The JSON object that is the value of the last `key` in `payload`, decoded alone."""
    if _COMPILED is not None:
        outcome, value = _COMPILED(payload, key)
        if outcome == 2:
            return value
        if outcome < 2:
            return _OUTCOMES[outcome]
    return py_object_after(payload, key)


def py_object_after(payload: bytes, key: bytes) -> object:
    """The reference `_object_after`: the json module's decoder."""
    at = payload.rfind(key)
    if at < 0:
        return _NOT_FOUND
    tail = payload[at + len(key) :].lstrip()
    if not tail.startswith(b":"):
        return _UNSURE
    tail = tail[1:].lstrip()
    if not tail.startswith((b"{", b"n")):
        return _UNSURE
    try:
        value, _ = _DECODER.raw_decode(tail.decode("utf-8", "replace"))
    except ValueError:
        return _UNSURE
    return value
