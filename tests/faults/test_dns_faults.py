"""DNS above 64 addresses: the kept subset is stable and spread over replicas, not the first 64
in string order (which dropped the only live address for every replica: all 502)."""

from __future__ import annotations

import asyncio
import contextlib

from specproxy.fleet.discovery import MAX_ENDPOINTS, DnsDiscovery
from tests.faults.conftest import fault_row, rss_bytes

ADDRESSES = 130
REPLICAS = 8
LIVE = "127.0.0.99"  # last of 127.0.0.1..130 in string order


async def _reaches(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with contextlib.suppress(OSError):
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port)), 60.0)
        writer.close()
        return True
    return False


async def test_over_64_addresses_every_replica_keeps_a_spread_stable_subset() -> None:
    rss_before = rss_bytes()
    server = await asyncio.start_server(lambda r, w: w.close(), LIVE, 0)
    port = server.sockets[0].getsockname()[1]
    addresses = [f"127.0.0.{i}" for i in range(1, ADDRESSES + 1)]

    async def resolver(name: str, _port: int) -> list[str]:
        return addresses

    try:
        kept: list[tuple[str, ...]] = []
        for replica in range(REPLICAS):
            found = DnsDiscovery(
                "engines", port, interval_s=60, on_change=lambda _: None,
                resolver=resolver, seed=f"specproxy-{replica}",
            )  # fmt: skip
            urls = await found.refresh()
            assert len(urls) == MAX_ENDPOINTS
            addresses.reverse()  # the resolver's order does not matter: the same subset
            assert await found.refresh() == urls
            kept.append(urls)
        addresses.remove("127.0.0.7")  # one address goes: only it leaves any subset
        for replica, urls in enumerate(kept):
            again = DnsDiscovery(
                "engines", port, interval_s=60, on_change=lambda _: None,
                resolver=resolver, seed=f"specproxy-{replica}",
            )  # fmt: skip
            after = set(await again.refresh())
            assert len(set(urls) - after) <= 1 and len(after - set(urls)) <= 1
        assert len({urls for urls in kept}) == REPLICAS  # the replicas keep different subsets
        union = set().union(*kept)
        assert len(union) > 0.9 * ADDRESSES  # together they reach nearly every pod
        live = [urls for urls in kept if any([await _reaches(u) for u in urls])]
        assert 0 < len(live) < REPLICAS  # the only live engine is reached by some replicas
    finally:
        server.close()
        await server.wait_closed()
    fault_row(f"DNS: {ADDRESSES} addresses, 1 live, {REPLICAS} replicas",
              f"{len(live)} of {REPLICAS} replicas reach it (main: 0, all 502)",
              "n/a", 0, rss_before, rss_bytes())  # fmt: skip
