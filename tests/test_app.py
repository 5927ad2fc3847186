"""App wiring: injected registry and recorder, extension points, probes, /api/stats."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import AsyncIterator
from typing import Any, cast

import prometheus_client
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import (
    CONFIG,
    FORWARDER,
    METRICS,
    RECORDER,
    REGISTRY,
    SESSIONS,
    STATS,
    STATS_JOB,
    STORE,
)
from specproxy.config import ArmConfig, Config, OnDown, StoreConfig
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.stats.result import StatsResult


def closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


def config() -> Config:
    """Both arms closed; the default SQLite store, but in a temp dir, never in the cwd."""
    url = closed_url()
    tmp = os.path.join(tempfile.gettempdir(), f"specproxy-test-app-{os.getpid()}")
    store = StoreConfig(url=f"sqlite:///{tmp}/store.db", spill_path=f"{tmp}/spill.jsonl")
    return Config(baseline_url=url, speculative_url=url, store=store)


async def test_shared_objects_live_under_typed_keys(aiohttp_client: AiohttpClient) -> None:
    registry, recorder, cfg = CollectorRegistry(), MemoryRecorder(), config()
    app = create_app(cfg, registry=registry, recorder=recorder, with_store=False, with_stats=False)
    await aiohttp_client(app)
    assert app[CONFIG] is cfg and app[REGISTRY] is registry and app[RECORDER] is recorder
    assert app[METRICS].registry is registry
    sessions = app[SESSIONS]
    assert set(sessions) == {"speculative", "baseline"}
    assert app[FORWARDER] is not None


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"recorder": MemoryRecorder()}, "pass with_store=False"),
        ({"recorder": MemoryRecorder(), "with_store": False}, "needs with_store=True"),
        ({"with_store": False}, "needs with_store=True"),
    ],
)
def test_components_are_never_switched_off_silently(kwargs: dict[str, Any], message: str) -> None:
    """An injected recorder used to drop the store and the stats job without a word."""
    with pytest.raises(ValueError, match=message):
        create_app(config(), **kwargs)


async def test_store_without_the_stats_job(aiohttp_client: AiohttpClient) -> None:
    app = create_app(config(), with_stats=False)
    client = await aiohttp_client(app)
    assert app[RECORDER] is app[STORE]
    assert STATS_JOB not in app and STATS not in app
    async with client.get("/api/stats") as resp:
        assert resp.status == 503
        assert "not running" in (await resp.json())["error"]["message"]


async def test_metrics_come_from_the_injected_registry(aiohttp_client: AiohttpClient) -> None:
    registry = CollectorRegistry()
    client = await aiohttp_client(create_app(config(), registry=registry))
    async with client.post("/v1/completions", json={"model": "m", "prompt": "x"}) as resp:
        assert resp.status == 502
    async with client.get("/metrics") as resp:
        text = await resp.text()
        assert resp.headers["Content-Type"].startswith("text/plain")
    assert 'specproxy_requests_total{arm="' in text and 'status="502"' in text
    assert prometheus_client.REGISTRY.get_sample_value("specproxy_requests_total") is None


async def test_a_component_context_can_replace_the_recorder(
    aiohttp_client: AiohttpClient,
) -> None:
    """The store's plug-in pattern: a cleanup_ctx that sets RECORDER, appended from outside."""
    replacement = MemoryRecorder()
    events: list[str] = []

    async def store_ctx(app: web.Application) -> AsyncIterator[None]:
        app[RECORDER] = replacement
        events.append("started")
        yield
        events.append(f"closed with {len(replacement.records)} record(s)")

    app = create_app(config())
    app.cleanup_ctx.append(store_ctx)
    client = await aiohttp_client(app)
    async with client.post("/v1/completions", json={"model": "m", "prompt": "x"}) as resp:
        assert resp.status == 502
    await client.close()
    assert events == ["started", "closed with 1 record(s)"]


async def test_stats_endpoint_is_503_until_a_provider_is_registered(
    aiohttp_client: AiohttpClient,
) -> None:
    # No stats job: nothing registers a provider.
    app = create_app(config(), recorder=MemoryRecorder(), with_store=False, with_stats=False)
    client = await aiohttp_client(app)
    async with client.get("/api/stats") as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == 503

    latest: dict[str, Any] | None = None

    async def stats_ctx(app: web.Application) -> AsyncIterator[None]:
        def provider() -> StatsResult | None:
            return cast(StatsResult | None, latest)  # any JSON: the endpoint only serialises

        app[STATS] = provider
        yield

    app = create_app(config(), recorder=MemoryRecorder(), with_store=False, with_stats=False)
    app.cleanup_ctx.append(stats_ctx)
    client = await aiohttp_client(app)
    async with client.get("/api/stats") as resp:
        assert resp.status == 503  # registered, but nothing computed yet
    latest = {"speedup": 1.7}
    async with client.get("/api/stats") as resp:
        assert resp.status == 200
        assert await resp.json() == {"speedup": 1.7}


async def test_probes_when_the_arms_are_down(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_app(config()))
    async with client.get("/healthz") as resp:
        assert resp.status == 200
    async with client.get("/readyz") as resp:
        assert resp.status == 503
        assert await resp.json() == {
            "ready": False,
            "arms": {"speculative": False, "baseline": False},
            "degraded": ["speculative"],
        }


@pytest.mark.parametrize(
    ("up", "on_down", "status", "degraded"),
    [
        ({"baseline", "speculative"}, "control", 200, []),
        ({"baseline"}, "control", 200, ["speculative"]),  # the treatment fails open
        ({"baseline"}, "error", 503, []),  # ... unless it answers with its own errors
        ({"speculative"}, "control", 503, []),  # the control down: never served by a treatment
    ],
)
async def test_readiness_needs_the_control_arm_and_names_a_degraded_treatment(
    aiohttp_client: AiohttpClient,
    aiohttp_server: AiohttpServer,
    up: set[str],
    on_down: OnDown,
    status: int,
    degraded: list[str],
) -> None:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    health = web.Application()
    health.router.add_get("/health", ok)
    live = str((await aiohttp_server(health)).make_url("")).rstrip("/")
    url = {arm: live if arm in up else closed_url() for arm in ("baseline", "speculative")}
    cfg = Config(
        baseline_url=url["baseline"],
        speculative_url=url["speculative"],
        speculative=ArmConfig(on_down=on_down),
    )
    app = create_app(cfg, recorder=MemoryRecorder(), with_store=False, with_stats=False)
    client = await aiohttp_client(app)
    async with client.get("/readyz") as resp:
        assert resp.status == status
        body = await resp.json()
    assert body["arms"] == {"speculative": "speculative" in up, "baseline": "baseline" in up}
    assert body["degraded"] == degraded and body["ready"] is (status == 200)
