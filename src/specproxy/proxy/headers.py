"""Which headers cross the proxy, in each direction, and the two the proxy adds itself.

Hop-by-hop headers (and those named by the client's `Connection` header) never cross; the
length is recomputed by whoever writes the body; `x-specproxy-arm` and `x-specproxy-request-id`
are set by the proxy on every answer (an upstream that sends them, e.g. another specproxy, is
overridden). The forced-arm header is the proxy's own business and is not forwarded either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

from aiohttp import web
from multidict import CIMultiDict

from specproxy.proxy.routing import FORCED_ARM_HEADER
from specproxy.records import Arm

__all__ = [
    "ARM_HEADER",
    "REQUEST_ID_HEADER",
    "OutboundHeaders",
    "is_event_stream",
    "response_headers",
    "safe_path",
]

ARM_HEADER: Final = "x-specproxy-arm"
REQUEST_ID_HEADER: Final = "x-specproxy-request-id"
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Request headers the proxy never forwards: hop-by-hop ones, those aiohttp recomputes, its own.
_DROP_REQUEST: Final = _HOP_BY_HOP | {"host", "content-length", "expect", FORCED_ARM_HEADER}
_DROP_REQUEST_BYTES: Final = frozenset(name.encode() for name in _DROP_REQUEST)
# Response headers the proxy never forwards: hop-by-hop ones, the length (aiohttp sets it), and
# its own, which it sets (an upstream that sends them, e.g. another specproxy, is overridden).
_DROP_RESPONSE: Final = _HOP_BY_HOP | {"content-length", ARM_HEADER, REQUEST_ID_HEADER}


class OutboundHeaders:
    """The client's headers that go upstream, rendered on demand for the transport that sends
    them: raw `name: value\\r\\n` lines (the lean transport) or a `CIMultiDict` (aiohttp's).

    Made from aiohttp's parsed headers and the raw header pairs of the same request, so the raw
    lines are the client's bytes, never decoded and re-encoded (aiohttp's parser already
    rejected CR/LF in them).
    """

    __slots__ = ("_headers", "_lines", "_multidict", "_raw")

    def __init__(
        self, headers: Mapping[str, str], raw: Sequence[tuple[bytes, bytes]] | None = None
    ) -> None:
        self._headers = headers
        self._raw = raw
        self._lines: bytes | None = None
        self._multidict: CIMultiDict[str] | None = None

    @classmethod
    def of(cls, request: web.BaseRequest) -> OutboundHeaders:
        return cls(request.headers, request.raw_headers)

    def _dropped(self) -> frozenset[str]:
        connection = self._headers.get("Connection")
        if not connection:
            return _DROP_REQUEST
        return _DROP_REQUEST | {token.strip().lower() for token in connection.split(",")}

    def multidict(self) -> CIMultiDict[str]:
        """The forwarded headers, for aiohttp's client."""
        if self._multidict is None:
            drop = self._dropped()
            self._multidict = CIMultiDict(
                (k, v) for k, v in self._headers.items() if k.lower() not in drop
            )
        return self._multidict

    def lines(self) -> bytes:
        """The forwarded headers as raw header lines, for the lean client."""
        if self._lines is None:
            if self._raw is None:
                self._lines = "".join(
                    [f"{k}: {v}\r\n" for k, v in self.multidict().items()]
                ).encode("utf-8", "surrogateescape")
            else:
                drop = self._dropped_bytes()
                self._lines = b"".join(
                    [
                        name + b": " + value + b"\r\n"
                        for name, value in self._raw
                        if name.lower() not in drop
                    ]
                )
        return self._lines

    def _dropped_bytes(self) -> frozenset[bytes]:
        connection = self._headers.get("Connection")
        if not connection:
            return _DROP_REQUEST_BYTES
        tokens = {t.strip().lower().encode("latin-1") for t in connection.split(",")}
        return _DROP_REQUEST_BYTES | tokens


def response_headers(
    headers: Mapping[str, str], arm: Arm, request_id: str
) -> list[tuple[str, str]]:
    """The upstream's headers minus dropped ones, plus ours: a list, since aiohttp's response
    copies what it is given into its own CIMultiDict anyway."""
    drop = _DROP_RESPONSE
    out = [(k, v) for k, v in headers.items() if k.lower() not in drop]
    out.append((ARM_HEADER, arm))
    out.append((REQUEST_ID_HEADER, request_id))
    return out


def is_event_stream(headers: Mapping[str, str]) -> bool:
    """Whether an upstream answer is a server-sent event stream."""
    return headers.get("Content-Type", "").startswith("text/event-stream")


def safe_path(raw: str) -> bool:
    """Origin-form `/v1/...` paths only: no absolute URIs, dot segments or backslashes."""
    if not raw.startswith("/v1/") or "\\" in raw:
        return False
    path = raw.split("?", 1)[0]
    lowered = path.lower()
    if "%2e" in lowered or "%2f" in lowered or "%5c" in lowered or "//" in path:
        return False
    return all(segment not in (".", "..") for segment in path.split("/"))
