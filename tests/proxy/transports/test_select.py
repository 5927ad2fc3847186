"""Transports are chosen once per endpoint and mode, from the endpoint's base URL."""

from __future__ import annotations

import aiohttp

from specproxy.config import TimeoutConfig
from specproxy.proxy.transports.aio import AiohttpTransport
from specproxy.proxy.transports.lean import LeanTransport
from specproxy.proxy.transports.select import Mode, default_transports


async def test_plain_http_engines_get_the_lean_transport_for_measured_calls() -> None:
    async with aiohttp.ClientSession() as session:
        make = default_transports(
            dict.fromkeys(("speculative", "baseline"), session), TimeoutConfig()
        )
        plain = make("speculative", "http://10.0.0.1:8000/prefix")
        lean, stream = plain[Mode.BUFFERED], plain[Mode.STREAM]
        assert isinstance(lean, LeanTransport) and isinstance(stream, LeanTransport)
        assert stream.pool is lean.pool  # one connection pool per endpoint
        assert isinstance(plain[Mode.PASSTHROUGH], AiohttpTransport)  # any method, HEAD too
        for url in ("https://engine:8443", "http://engine:8000/?token=x"):
            chosen = make("baseline", url)
            assert all(isinstance(chosen[mode], AiohttpTransport) for mode in Mode)
        await lean.close()


def test_mode_of_a_measured_call() -> None:
    assert Mode.measured(True) is Mode.STREAM and Mode.measured(False) is Mode.BUFFERED
