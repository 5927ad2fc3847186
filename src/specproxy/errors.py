"""The exception tree of specproxy, and the kinds of failure a request record can name.

    SpecProxyError
     ├── ConfigError (ValueError)            bad configuration, reported at start-up
     ├── UpstreamError                       an arm's engine could not serve a call
     │    ├── UpstreamConnectError           refused / unreachable; nothing was sent  -> HTTP 502
     │    ├── UpstreamTimeout (TimeoutError) connect, or a read, timed out            -> HTTP 504
     │    │    └── UpstreamConnectTimeout     the connect timed out; nothing was sent
     │    └── UpstreamBroken                 closed, cut short or not HTTP/1.x        -> HTTP 502
     ├── StoreError                          the store failed (records are buffered, then spilled)
     └── ScrapeError                         an engine's /metrics could not be read or parsed

`UpstreamError`s are raised by the upstream transports only (`specproxy.proxy.transports`): the
lean client raises them itself, and aiohttp's exceptions are mapped to them once, where the
aiohttp transport calls aiohttp (`transports.aio.upstream_error`). Above the transports nothing
catches a foreign exception. Each class carries the `ErrorKind` its records get, the status and
the error type the client gets when nothing had been sent to it yet.

`ErrorKind` is what `RequestRecord.error_kind`, the `kind` label of
`specproxy_upstream_errors_total`, the statistics and the dashboards call a failure. It is a
`StrEnum`: its values are the strings stored rows and dashboards already hold.

Client-facing failures are rendered as OpenAI-style JSON bodies by `error_body`, so that every
client library that talks to vLLM understands the proxy's own errors too.
"""

from __future__ import annotations

import enum
import json
from typing import Any, ClassVar

__all__ = [
    "ConfigError",
    "ErrorKind",
    "ScrapeError",
    "SpecProxyError",
    "StoreError",
    "UpstreamBroken",
    "UpstreamConnectError",
    "UpstreamConnectTimeout",
    "UpstreamError",
    "UpstreamTimeout",
    "error_body",
]


class ErrorKind(enum.StrEnum):
    """Why a call to an arm did not end in a complete, successful response."""

    CONNECT = "connect"  # no connection to the engine (nothing was sent)
    TIMEOUT = "timeout"  # connect or read timeout
    BROKEN = "broken"  # the engine's response was cut short or was not HTTP
    HTTP_4XX = "http_4xx"  # the engine answered 4xx (passed through)
    HTTP_5XX = "http_5xx"  # the engine answered 5xx (passed through)
    MALFORMED_STREAM = "malformed_stream"  # a 200 event stream without its `data: [DONE]`
    STREAM_ERROR = "stream_error"  # a 200 event stream that carried an error object
    EVENT_TOO_LARGE = "event_too_large"  # one event outgrew `max_event_bytes`: stream ended
    DISCONNECTED = "disconnected"  # the client went away first
    CANCELLED = "cancelled"  # the proxy cancelled a shadow call (shutdown)

    @property
    def engine_failure(self) -> bool:
        """Whether the engine itself failed (what outlier ejection and error alerts count)."""
        return self in _ENGINE_FAILURES

    @property
    def verdict_free(self) -> bool:
        """The client or the proxy ended the call: it says nothing about the engine."""
        return self in (ErrorKind.DISCONNECTED, ErrorKind.CANCELLED)

    @classmethod
    def of_status(cls, status: int) -> ErrorKind | None:
        """The kind of an engine's HTTP answer: None below 400."""
        if status < 400:
            return None
        return cls.HTTP_4XX if status < 500 else cls.HTTP_5XX


_ENGINE_FAILURES = frozenset(
    {
        ErrorKind.CONNECT,
        ErrorKind.TIMEOUT,
        ErrorKind.BROKEN,
        ErrorKind.HTTP_5XX,
        ErrorKind.MALFORMED_STREAM,
        ErrorKind.STREAM_ERROR,
    }
)


class SpecProxyError(Exception):
    """Base class of every error specproxy raises on purpose."""


class ConfigError(SpecProxyError, ValueError):
    """The configuration is invalid; the message names the offending setting."""


class UpstreamError(SpecProxyError):
    """An arm's engine failed to answer; raised by the upstream transports only."""

    kind: ClassVar[ErrorKind] = ErrorKind.BROKEN
    status: ClassVar[int] = 502
    error_type: ClassVar[str] = "BadGateway"
    summary: ClassVar[str] = "failed"
    never_sent: ClassVar[bool] = False  # True: no request byte left, another engine may serve it

    def client_message(self, arm: str) -> str:
        """What the client reads in the error body."""
        detail = str(self)
        return (
            f"the {arm} arm {self.summary}: {detail}" if detail else f"the {arm} arm {self.summary}"
        )


class UpstreamConnectError(UpstreamError):
    """The engine refused the connection or could not be reached; nothing was sent."""

    kind = ErrorKind.CONNECT
    summary = "could not be reached"
    never_sent = True


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The engine did not connect, or went silent, for longer than the configured timeout."""

    kind = ErrorKind.TIMEOUT
    status = 504
    error_type = "GatewayTimeout"
    summary = "timed out"

    def client_message(self, arm: str) -> str:
        return f"the {arm} arm {self.summary}"


class UpstreamConnectTimeout(UpstreamTimeout):
    """Connecting to the engine timed out (a black-holed address); nothing was sent, so another
    endpoint, or the control, may serve the request, as after a refused connection."""

    never_sent = True


class UpstreamBroken(UpstreamError):
    """The engine closed the connection, or sent something that is not HTTP/1.x, mid-response."""

    kind = ErrorKind.BROKEN
    summary = "sent a broken response"


class StoreError(SpecProxyError):
    """The request store could not be written or read."""


class ScrapeError(SpecProxyError):
    """An engine's /metrics endpoint could not be fetched or parsed."""


def error_body(message: str, *, status: int, error_type: str, param: str | None = None) -> bytes:
    """An OpenAI/vLLM-style error body: `{"error": {message, type, param, code}}`."""
    body: dict[str, Any] = {
        "error": {"message": message, "type": error_type, "param": param, "code": status}
    }
    return json.dumps(body).encode()
