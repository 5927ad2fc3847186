"""Each arm's `TimeoutConfig` as the aiohttp timeouts of its three kinds of upstream call.

    stream       the session's default: connect, `read_s` of silence between bytes (the first
                 byte too), `stream_total_s` for the whole stream
    call         a non-streaming call: connect, then `total_s` for the whole answer and no
                 silence bound (a non-streaming generation is silent until it is done)
    passthrough  any other /v1/* call, which may or may not stream: connect, `total_s` of
                 silence (as long as a non-streaming call may be silent), `stream_total_s` in all

The lean transport (measured calls to plain-http arms) takes the same bounds as numbers: a
stream `connect_s`, `read_s` of silence and `stream_total_s` as its deadline, a non-streaming
call `connect_s` and `total_s` as its deadline (`transports.select`).
"""

from __future__ import annotations

from dataclasses import dataclass

from aiohttp import ClientTimeout

from specproxy.config import TimeoutConfig

__all__ = ["ArmTimeouts"]


@dataclass(frozen=True, slots=True)
class ArmTimeouts:
    """The aiohttp timeouts of one arm's calls."""

    stream: ClientTimeout
    call: ClientTimeout
    passthrough: ClientTimeout

    @classmethod
    def of(cls, cfg: TimeoutConfig) -> ArmTimeouts:
        return cls(
            stream=ClientTimeout(
                total=cfg.stream_total_s, sock_connect=cfg.connect_s, sock_read=cfg.read_s
            ),
            call=ClientTimeout(total=cfg.total_s, sock_connect=cfg.connect_s, sock_read=None),
            passthrough=ClientTimeout(
                total=cfg.stream_total_s, sock_connect=cfg.connect_s, sock_read=cfg.total_s
            ),
        )
