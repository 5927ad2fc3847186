"""Which transport serves which calls: chosen once per engine endpoint and `Mode`.

Plain-http engines get the lean transport for measured calls (streamed or not, one connection
pool); everything else, and the unmeasured pass-through (any method, HEAD included), gets
aiohttp's. Each mode's transport carries that kind of call's timeouts. An endpoint's
transports are made when the endpoint is first used (`proxy.endpoints`), from its base URL, so
every endpoint of an arm's pool can have its own.

To add a client: implement `base.UpstreamTransport` in a module beside this one (raising only
`specproxy.errors.UpstreamError`s) and return it from `default_transports` where it applies.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

from aiohttp import ClientSession

from specproxy.config import TimeoutConfig
from specproxy.proxy.timeouts import ArmTimeouts
from specproxy.proxy.transports.aio import AiohttpTransport
from specproxy.proxy.transports.base import UpstreamTransport
from specproxy.proxy.transports.lean import LeanTransport
from specproxy.records import Arm

__all__ = ["Mode", "TransportFactory", "Transports", "default_transports"]


class Mode(enum.Enum):
    """The kinds of call the proxy makes to an engine."""

    STREAM = "stream"  # a measured call that asked for a stream
    BUFFERED = "buffered"  # a measured call that did not
    PASSTHROUGH = "passthrough"  # any other /v1/* request, unmeasured

    @classmethod
    def measured(cls, stream: bool) -> Mode:
        return cls.STREAM if stream else cls.BUFFERED


Transports = Mapping[Mode, UpstreamTransport]
# (arm, engine base URL) -> the transport of each mode for that endpoint.
TransportFactory = Callable[[Arm, str], Transports]


def default_transports(
    sessions: Mapping[Arm, ClientSession],
    timeouts: TimeoutConfig | Callable[[Arm], TimeoutConfig],
) -> TransportFactory:
    """The production choice: lean for measured calls to plain-http engines, else aiohttp;
    each with its arm's timeouts for that kind of call (`proxy.timeouts`)."""

    def make(arm: Arm, base_url: str) -> Transports:
        cfg = timeouts.for_arm(arm) if isinstance(timeouts, TimeoutConfig) else timeouts(arm)
        aio = ArmTimeouts.of(cfg)
        session = sessions[arm]
        passthrough = AiohttpTransport(base_url, session, aio.passthrough)
        if not LeanTransport.usable(base_url):
            return {
                Mode.STREAM: AiohttpTransport(base_url, session, aio.stream),
                Mode.BUFFERED: AiohttpTransport(base_url, session, aio.call),
                Mode.PASSTHROUGH: passthrough,
            }
        # One connection pool per endpoint: a stream is bounded by silence (`read_s`) and its
        # cap, a non-streaming call (silent until done) by its deadline alone.
        stream = LeanTransport(
            base_url, connect_s=cfg.connect_s, read_s=cfg.read_s, deadline_s=cfg.stream_total_s
        )
        buffered = stream.with_timeouts(
            connect_s=cfg.connect_s, read_s=None, deadline_s=cfg.total_s
        )
        return {Mode.STREAM: stream, Mode.BUFFERED: buffered, Mode.PASSTHROUGH: passthrough}

    return make
