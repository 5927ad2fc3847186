"""Which engine endpoint of an arm serves a call, and the clients that reach it.

An arm is a pool of endpoints (`fleet.pool`): `Upstreams.pick` takes the endpoint with the
fewest calls in flight (round-robin among equals, ejected endpoints skipped) and returns what
the request path needs to call it: absolute URLs for the aiohttp session and, for plain-http
endpoints, a lean keep-alive client (`upstream.UpstreamPool`) of its own. `done` hands the
outcome back, which is what ejects an endpoint that keeps failing. A call that could not even
connect (`never_sent`) is tried on the arm's other endpoints, so a dead engine costs the
clients only the calls that were already in flight on it. Clients of endpoints that
left the pool (DNS discovery) are closed once nothing was picked from them for a while.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable
from typing import Final

from aiohttp import ClientConnectorError
from yarl import URL

from specproxy.config import Config, TimeoutConfig
from specproxy.fleet.arms import Fleet
from specproxy.fleet.pool import Endpoint
from specproxy.proxy.upstream import ConnectFailed, UpstreamPool
from specproxy.records import Arm

__all__ = ["ENDPOINT_FAILURES", "EndpointClients", "Upstreams", "never_sent", "verdict"]

# `RequestRecord.error_kind` values that say the endpoint itself failed (outlier detection).
ENDPOINT_FAILURES: Final = frozenset(
    {"connect", "timeout", "broken", "http_5xx", "malformed_stream", "stream_error"}
)
# Outcomes that say nothing about the endpoint: the client or the proxy ended the call.
_NO_VERDICT: Final = frozenset({"disconnected", "cancelled"})


def never_sent(exc: BaseException) -> bool:
    """True when the call failed before a byte of the request left: safe on another endpoint."""
    return isinstance(exc, (ConnectFailed, ClientConnectorError))


def verdict(error_kind: str | None) -> bool | None:
    """The outcome of a call for the endpoint's failure streak (None: no verdict)."""
    if error_kind is None:
        return True
    if error_kind in _NO_VERDICT:
        return None
    return error_kind not in ENDPOINT_FAILURES


class EndpointClients:
    """How the proxy calls one endpoint: session URLs per path, and the lean client if usable."""

    __slots__ = ("base", "lean", "lean_paths", "urls")

    def __init__(self, base: str, paths: Iterable[str], timeouts: TimeoutConfig) -> None:
        self.base = base
        paths = tuple(paths)
        self.urls = {path: URL(base + path, encoded=True) for path in paths}
        self.lean: UpstreamPool | None = None
        self.lean_paths: dict[str, str] = {}
        url = URL(base)
        if url.scheme == "http" and url.host is not None and not url.query_string:
            self.lean = UpstreamPool(
                url.host,
                url.port or 80,
                connect_timeout=timeouts.connect_s,
                # Non-streaming calls only, silent until done: each call's deadline bounds it.
                read_timeout=None,
            )
            prefix = url.raw_path.rstrip("/")
            self.lean_paths = {path: prefix + path for path in paths}

    async def close(self) -> None:
        if self.lean is not None:
            await self.lean.close()


class Upstreams:
    """Every arm's endpoints with their clients, created on first use."""

    def __init__(self, cfg: Config, fleet: Fleet, paths: Iterable[str]) -> None:
        self._cfg = cfg
        self._fleet = fleet
        self._paths = tuple(paths)
        self._clients: dict[str, EndpointClients] = {}
        self._inflight: dict[str, int] = {}  # calls in flight per endpoint URL, any pool
        self._pruning: set[asyncio.Task[None]] = set()

    def pick(self, arm: Arm) -> tuple[Endpoint, EndpointClients]:
        """The endpoint for the next call to `arm` (counted in flight until `done`)."""
        return self._clients_for(arm, self._fleet.pool(arm).acquire())

    def _clients_for(self, arm: Arm, endpoint: Endpoint) -> tuple[Endpoint, EndpointClients]:
        url = endpoint.url
        clients = self._clients.get(url)
        if clients is None:
            timeouts = self._cfg.timeouts.for_arm(arm.value)
            clients = self._clients[url] = EndpointClients(url, self._paths, timeouts)
            task = asyncio.get_running_loop().create_task(self.prune())
            self._pruning.add(task)
            task.add_done_callback(self._pruning.discard)
        self._inflight[url] = self._inflight.get(url, 0) + 1
        return endpoint, clients

    def pick_other(
        self, arm: Arm, tried: Collection[str]
    ) -> tuple[Endpoint, EndpointClients] | None:
        """Another endpoint of `arm` than those `tried`, for a call that was never sent."""
        endpoint = self._fleet.pool(arm).acquire_other(tried)
        return None if endpoint is None else self._clients_for(arm, endpoint)

    def done(self, arm: Arm, endpoint: Endpoint, error_kind: str | None) -> None:
        """The call ended with `error_kind` (None: success)."""
        self._inflight[endpoint.url] -= 1
        self._fleet.pool(arm).release(endpoint, ok=verdict(error_kind))

    @property
    def clients(self) -> int:
        """Endpoints with open clients (bounded by the pools plus those still in flight)."""
        return len(self._clients)

    async def prune(self) -> None:
        """Close the clients of endpoints that left every pool and have nothing in flight."""
        live = {url for arm in Arm for url in self._fleet.endpoints(arm)}
        for url in [u for u in self._clients if u not in live and not self._inflight.get(u)]:
            self._inflight.pop(url, None)
            await self._clients.pop(url).close()

    async def close(self) -> None:
        for task in list(self._pruning):
            await task
        clients, self._clients = list(self._clients.values()), {}
        for c in clients:
            await c.close()
