"""Which headers cross the proxy, in each direction, and the two the proxy adds itself.

Hop-by-hop headers (and those named by the client's `Connection` header) never cross; the
length is recomputed by whoever writes the body; `x-specproxy-arm` and `x-specproxy-request-id`
are set by the proxy on every answer (an upstream that sends them, e.g. another specproxy, is
overridden). The forced-arm header is the proxy's own business and is not forwarded either.

An arm may add headers of its own (`ArmHeaders`: `[<arm>].headers` and its API key), applied to
the client's as `OutboundHeaders.for_arm` on the way to that arm: its headers replace a client's
of the same name; its key is `Authorization: Bearer <key>`, sent where the client sent no
Authorization (`authorization = "client"`, the default: the client's own is kept) or instead of
the client's (`"arm"`). An arm without either costs nothing: `for_arm` returns the same object.
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
    "RESPONSE_DROP",
    "ArmHeaders",
    "OutboundHeaders",
    "forwarded",
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
# The same names, for a transport that filters them while it parses (lean: `wire.split_head`).
RESPONSE_DROP: Final = tuple(sorted(_DROP_RESPONSE))


class ArmHeaders:
    """What one arm adds to the headers it is sent: its own ones and its API key."""

    __slots__ = ("api_key", "empty", "headers", "replace_authorization")

    def __init__(
        self,
        headers: Mapping[str, str] | None = None,
        api_key: str | None = None,
        *,
        replace_authorization: bool = False,
    ) -> None:
        self.headers = tuple((headers or {}).items())
        self.api_key = api_key
        self.replace_authorization = replace_authorization and api_key is not None
        self.empty = not self.headers and api_key is None

    def added(self, client_authorization: bool) -> list[tuple[str, str]]:
        """The headers to add (each replacing the client's of its name), given whether the
        client sent an Authorization header."""
        out = list(self.headers)
        if self.api_key is not None and (self.replace_authorization or not client_authorization):
            out.append(("Authorization", f"Bearer {self.api_key}"))
        return out

    def __repr__(self) -> str:  # never the key
        names = [name for name, _ in self.headers]
        return f"ArmHeaders({names}, api_key={'set' if self.api_key else None})"


class OutboundHeaders:
    """The client's headers that go upstream, rendered on demand for the transport that sends
    them: raw `name: value\\r\\n` lines (the lean transport) or a `CIMultiDict` (aiohttp's).

    Made from aiohttp's parsed headers and the raw header pairs of the same request, so the raw
    lines are the client's bytes, never decoded and re-encoded (aiohttp's parser already
    rejected CR/LF in them).
    """

    __slots__ = ("_added", "_headers", "_lines", "_multidict", "_raw")

    def __init__(
        self,
        headers: Mapping[str, str],
        raw: Sequence[tuple[bytes, bytes]] | None = None,
        added: Sequence[tuple[str, str]] = (),
    ) -> None:
        self._headers = headers
        self._raw = raw
        self._added = tuple(added)  # an arm's own, replacing the client's of their names
        self._lines: bytes | None = None
        self._multidict: CIMultiDict[str] | None = None

    @classmethod
    def of(cls, request: web.BaseRequest) -> OutboundHeaders:
        return cls(request.headers, request.raw_headers)

    def adding(self, added: Sequence[tuple[str, str]]) -> OutboundHeaders:
        """These headers with `added` replacing the client's of their names (a span's
        `traceparent`, say); self if there are none."""
        if not added:
            return self
        return OutboundHeaders(self._headers, self._raw, (*self._added, *added))

    def for_arm(self, arm: ArmHeaders) -> OutboundHeaders:
        """These headers as sent to an arm with `arm`'s own added (self if it adds none)."""
        if arm.empty:
            return self
        added = arm.added("Authorization" in self._headers)
        return OutboundHeaders(self._headers, self._raw, (*self._added, *added))

    def _dropped(self) -> frozenset[str]:
        connection = self._headers.get("Connection")
        drop = _DROP_REQUEST
        if connection:
            drop = drop | {token.strip().lower() for token in connection.split(",")}
        if self._added:
            drop = drop | {name.lower() for name, _ in self._added}
        return drop

    def multidict(self) -> CIMultiDict[str]:
        """The forwarded headers, for aiohttp's client."""
        if self._multidict is None:
            drop = self._dropped()
            self._multidict = CIMultiDict(
                (k, v) for k, v in self._headers.items() if k.lower() not in drop
            )
            self._multidict.extend(self._added)
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
                    + [f"{k}: {v}\r\n".encode() for k, v in self._added]
                )
        return self._lines

    def _dropped_bytes(self) -> frozenset[bytes]:
        connection = self._headers.get("Connection")
        if not connection and not self._added:
            return _DROP_REQUEST_BYTES
        tokens = {t.strip().lower().encode("latin-1") for t in (connection or "").split(",")}
        added = {name.lower().encode() for name, _ in self._added}
        return _DROP_REQUEST_BYTES | (tokens - {b""}) | added


def forwarded(headers: Mapping[str, str]) -> list[tuple[str, str]]:
    """The upstream's response headers that reach the client (`Reply.forwarded`): all but the
    dropped ones (`RESPONSE_DROP`)."""
    drop = _DROP_RESPONSE
    return [(k, v) for k, v in headers.items() if k.lower() not in drop]


def response_headers(
    forward: Sequence[tuple[str, str]], arm: Arm, request_id: str
) -> list[tuple[str, str]]:
    """The client's response headers: the upstream's that cross (`forwarded`), plus ours; a
    list, since aiohttp's response copies what it is given into its own CIMultiDict anyway."""
    return [*forward, (ARM_HEADER, arm), (REQUEST_ID_HEADER, request_id)]


def is_event_stream(content_type: str) -> bool:
    """Whether an upstream answer with this Content-Type is a server-sent event stream."""
    return content_type.startswith("text/event-stream")


def safe_path(raw: str) -> bool:
    """Origin-form `/v1/...` paths only: no absolute URIs, dot segments or backslashes."""
    if not raw.startswith("/v1/") or "\\" in raw:
        return False
    path = raw.split("?", 1)[0]
    lowered = path.lower()
    if "%2e" in lowered or "%2f" in lowered or "%5c" in lowered or "//" in path:
        return False
    return all(segment not in (".", "..") for segment in path.split("/"))
