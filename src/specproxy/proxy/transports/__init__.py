"""Upstream transports: how the proxy reaches an engine (see `base` for the seam)."""

from specproxy.proxy.transports.aio import AiohttpTransport
from specproxy.proxy.transports.base import Reply, UpstreamTransport
from specproxy.proxy.transports.lean import LeanTransport
from specproxy.proxy.transports.mock import MockReply, MockRequest, MockTransport
from specproxy.proxy.transports.select import Mode, TransportFactory, Transports, default_transports

__all__ = [
    "AiohttpTransport",
    "LeanTransport",
    "MockReply",
    "MockRequest",
    "MockTransport",
    "Mode",
    "Reply",
    "TransportFactory",
    "Transports",
    "UpstreamTransport",
    "default_transports",
]
