from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from specproxy.fleet.discovery import DnsDiscovery, endpoint_url, system_resolver
from tests.fleet.fakes import HostsFileResolver


def rewrite(path: Path, text: str) -> None:
    path.write_text(text)


def append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


@pytest.fixture
def hosts(tmp_path: Path) -> Path:
    path = tmp_path / "hosts"
    path.write_text("10.0.0.2 vllm-spec.ns.svc\n10.0.0.1 vllm-spec.ns.svc\n10.0.0.9 other\n")
    return path


def test_endpoint_url_brackets_ipv6() -> None:
    assert endpoint_url("http", "10.1.2.3", 8000) == "http://10.1.2.3:8000"
    assert endpoint_url("http", "fd00::1", 8000) == "http://[fd00::1]:8000"
    assert endpoint_url("https", "engine", 443) == "https://engine:443"


async def test_refresh_follows_the_resolver_and_reports_changes(hosts: Path) -> None:
    changes: list[tuple[str, ...]] = []
    resolver = HostsFileResolver(hosts)
    disc = DnsDiscovery(
        "vllm-spec.ns.svc", 8000, interval_s=60, on_change=changes.append, resolver=resolver
    )
    assert await disc.refresh() == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert await disc.refresh() == ("http://10.0.0.1:8000", "http://10.0.0.2:8000")
    assert len(changes) == 1  # unchanged list: not reported again
    rewrite(hosts, "10.0.0.2 vllm-spec.ns.svc\n10.0.0.3 vllm-spec.ns.svc\n")
    assert await disc.refresh() == ("http://10.0.0.2:8000", "http://10.0.0.3:8000")
    assert changes[-1] == ("http://10.0.0.2:8000", "http://10.0.0.3:8000")
    assert len(changes) == 2


async def test_failed_or_empty_resolution_keeps_the_last_endpoints(hosts: Path) -> None:
    changes: list[tuple[str, ...]] = []
    resolver = HostsFileResolver(hosts)
    disc = DnsDiscovery(
        "vllm-spec.ns.svc", 8000, interval_s=60, on_change=changes.append, resolver=resolver
    )
    first = await disc.refresh()
    resolver.fail = True
    assert await disc.refresh() == first
    resolver.fail = False
    rewrite(hosts, "10.0.0.9 other\n")  # the name resolves to nothing
    assert await disc.refresh() == first
    assert disc.urls == first
    assert changes == [first]


async def test_background_refresh_picks_up_a_new_pod(hosts: Path) -> None:
    changed = asyncio.Event()
    seen: list[tuple[str, ...]] = []

    def on_change(urls: tuple[str, ...]) -> None:
        seen.append(urls)
        if len(seen) == 2:
            changed.set()

    disc = DnsDiscovery(
        "vllm-spec.ns.svc",
        9000,
        interval_s=0.01,
        on_change=on_change,
        resolver=HostsFileResolver(hosts),
    )
    await disc.start()
    assert seen == [
        ("http://10.0.0.1:9000", "http://10.0.0.2:9000")
    ]  # resolved before start returns
    append(hosts, "10.0.0.4 vllm-spec.ns.svc\n")
    try:
        await asyncio.wait_for(changed.wait(), timeout=30)
    finally:
        await disc.close()
    assert seen[-1] == ("http://10.0.0.1:9000", "http://10.0.0.2:9000", "http://10.0.0.4:9000")


async def test_system_resolver_resolves_localhost() -> None:
    addresses = await system_resolver("localhost", 80)
    assert "127.0.0.1" in addresses or "::1" in addresses
