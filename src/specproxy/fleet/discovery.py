"""An arm's endpoints from DNS: a name resolved periodically to the addresses behind it.

A headless Kubernetes Service (`clusterIP: None`) resolves to the IPs of its ready pods, which
makes this Kubernetes-native discovery without API access: `dns = "vllm-spec.ns.svc"` plus the
engine port. The resolver is injected (the default asks the system through `getaddrinfo`), so
tests control what a name resolves to.

Above `MAX_ENDPOINTS` addresses, each replica keeps the 64 that rank highest by rendezvous
hashing of (its host name, the address): stable across refreshes (an address that comes or goes
moves only itself in or out), and spread, since replicas with other host names keep other
subsets, so the fleet as a whole reaches every pod (string order pinned every replica to the
same 64, which could leave out the only live one).

A failed or empty resolution keeps the last known endpoints: a DNS hiccup must not empty an arm,
and requests to endpoints that really went away fail and get them ejected (`pool`).
"""

from __future__ import annotations

import asyncio
import hashlib
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable, Sequence

from specproxy.tasks import cancel_and_wait

__all__ = [
    "MAX_ENDPOINTS",
    "DnsDiscovery",
    "Resolver",
    "endpoint_url",
    "rendezvous_pick",
    "system_resolver",
]

logger = logging.getLogger("specproxy.fleet.discovery")

MAX_ENDPOINTS = 64  # addresses kept per name: bounds the arm's endpoint labels and pools

Resolver = Callable[[str, int], Awaitable[Sequence[str]]]
"""(name, port) -> the addresses the name resolves to now."""


async def system_resolver(name: str, port: int) -> list[str]:
    """The addresses of `name` from the system resolver (A and AAAA records, /etc/hosts)."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    return sorted({str(info[4][0]) for info in infos})


def endpoint_url(scheme: str, address: str, port: int) -> str:
    """`scheme://address:port`, with an IPv6 address in brackets."""
    try:
        is_v6 = ipaddress.ip_address(address).version == 6
    except ValueError:  # a host name
        is_v6 = False
    host = f"[{address}]" if is_v6 else address
    return f"{scheme}://{host}:{port}"


def rendezvous_pick(urls: Sequence[str], keep: int, seed: str) -> tuple[str, ...]:
    """The `keep` of `urls` with the highest rendezvous score for `seed`, in sorted order."""
    if len(urls) <= keep:
        return tuple(sorted(urls))

    def score(url: str) -> bytes:
        return hashlib.blake2b(f"{seed}\0{url}".encode(), digest_size=8).digest()

    return tuple(sorted(sorted(urls, key=score, reverse=True)[:keep]))


class DnsDiscovery:
    """Resolves `name` every `interval_s` and reports each changed endpoint list."""

    def __init__(
        self,
        name: str,
        port: int,
        *,
        interval_s: float,
        on_change: Callable[[tuple[str, ...]], None],
        scheme: str = "http",
        resolver: Resolver = system_resolver,
        seed: str | None = None,
    ) -> None:
        self._name = name
        self._port = port
        self._interval_s = interval_s
        self._on_change = on_change
        self._scheme = scheme
        self._resolver = resolver
        self._seed = socket.gethostname() if seed is None else seed  # the pod's name
        self._urls: tuple[str, ...] = ()
        self._task: asyncio.Task[None] | None = None

    @property
    def urls(self) -> tuple[str, ...]:
        """The last endpoint list resolved (empty until the first success)."""
        return self._urls

    async def refresh(self) -> tuple[str, ...]:
        """Resolve once; report and return the endpoint list (the last known one on failure)."""
        try:
            addresses = await self._resolver(self._name, self._port)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any resolver failure keeps the last list
            logger.warning(
                "resolving %s failed, keeping %d endpoints: %s", self._name, len(self._urls), exc
            )
            return self._urls
        urls = tuple(sorted({endpoint_url(self._scheme, a, self._port) for a in addresses}))
        if len(urls) > MAX_ENDPOINTS:
            logger.warning(
                "%s resolved to %d addresses; using %d chosen by rendezvous hashing on %s",
                self._name,
                len(urls),
                MAX_ENDPOINTS,
                self._seed,
            )
            urls = rendezvous_pick(urls, MAX_ENDPOINTS, self._seed)
        if not urls:
            logger.warning(
                "%s resolved to nothing, keeping %d endpoints", self._name, len(self._urls)
            )
            return self._urls
        if urls != self._urls:
            logger.info("%s -> %s", self._name, ", ".join(urls))
            self._urls = urls
            self._on_change(urls)
        return urls

    async def start(self) -> None:
        """Resolve once now (so the arm has endpoints), then keep refreshing in the background."""
        await self.refresh()
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"specproxy-dns-{self._name}")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.refresh()
