"""The exception tree of specproxy.

    SpecProxyError
     ├── ConfigError (ValueError)          bad configuration, reported at start-up
     ├── UpstreamError                     an arm could not serve a request
     │    ├── UpstreamConnectError         refused / unreachable            -> HTTP 502
     │    └── UpstreamTimeout (TimeoutError) connect or read timed out      -> HTTP 504
     ├── StoreError                        the store failed (records are buffered, then spilled)
     └── ScrapeError                       an engine's /metrics could not be read or parsed

Client-facing failures are rendered as OpenAI-style JSON bodies by `error_body`, so that every
client library that talks to vLLM understands the proxy's own errors too.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = [
    "ConfigError",
    "ScrapeError",
    "SpecProxyError",
    "StoreError",
    "UpstreamConnectError",
    "UpstreamError",
    "UpstreamTimeout",
    "error_body",
]


class SpecProxyError(Exception):
    """Base class of every error specproxy raises on purpose."""


class ConfigError(SpecProxyError, ValueError):
    """The configuration is invalid; the message names the offending setting."""


class UpstreamError(SpecProxyError):
    """An arm (vLLM server) failed to answer."""

    status = 502
    error_type = "BadGateway"

    def __init__(self, message: str, *, arm: str) -> None:
        super().__init__(message)
        self.arm = arm


class UpstreamConnectError(UpstreamError):
    """The arm refused the connection or could not be reached."""


class UpstreamTimeout(UpstreamError, TimeoutError):
    """The arm did not connect or answer within the configured timeout."""

    status = 504
    error_type = "GatewayTimeout"


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
