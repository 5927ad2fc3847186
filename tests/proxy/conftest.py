"""Fixtures: a pair of fake vLLM arms on port 0 and a factory for proxies in front of them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy.app import create_app
from specproxy.config import Config, RoutingConfig, TimeoutConfig
from specproxy.proxy.recorder import MemoryRecorder
from tests.proxy.fake_upstream import FakeUpstream

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
SPEC_ONLY = {"speculative_share": 1.0}


def chat(**extra: object) -> dict[str, object]:
    return {"model": "tiny-llama", "messages": [{"role": "user", "content": "hi"}], **extra}


async def direct(url: str, path: str, body: object, headers: dict[str, str] | None = None) -> bytes:
    async with (
        aiohttp.ClientSession() as session,
        session.post(url.rstrip("/") + path, json=body, headers=headers) as resp,
    ):
        return await resp.read()


@dataclass
class Arms:
    speculative: FakeUpstream
    baseline: FakeUpstream
    speculative_url: str
    baseline_url: str


@dataclass
class Proxy:
    client: TestClient[web.Request, None]
    server: TestServer
    app: web.Application
    recorder: MemoryRecorder
    registry: CollectorRegistry

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float:
        """The sum of `name` over every series carrying `labels` (others, e.g. model, any)."""
        wanted = (labels or {}).items()
        return sum(
            s.value
            for metric in self.registry.collect()
            for s in metric.samples
            if s.name == name and wanted <= s.labels.items()
        )


MakeProxy = Callable[..., Awaitable[Proxy]]


@pytest.fixture
async def arms(aiohttp_server: AiohttpServer) -> Arms:
    spec = FakeUpstream("speculative")
    base = FakeUpstream("baseline")
    spec_server = await aiohttp_server(spec.app())  # TestServer runs with handler_cancellation=True
    base_server = await aiohttp_server(base.app())  # TestServer runs with handler_cancellation=True
    return Arms(spec, base, str(spec_server.make_url("")), str(base_server.make_url("")))


@pytest.fixture
def make_proxy(
    arms: Arms, aiohttp_server: AiohttpServer, aiohttp_client: AiohttpClient
) -> MakeProxy:
    async def make(
        *,
        routing: dict[str, Any] | None = None,
        timeouts: dict[str, Any] | None = None,
        baseline_url: str | None = None,
        speculative_url: str | None = None,
        **top: Any,
    ) -> Proxy:
        cfg = Config(
            baseline_url=baseline_url or arms.baseline_url,
            speculative_url=speculative_url or arms.speculative_url,
            routing=RoutingConfig(**(routing or {})),
            timeouts=TimeoutConfig(**(timeouts or {})),
            **top,
        )
        registry = CollectorRegistry()
        recorder = MemoryRecorder()
        app = create_app(
            cfg, registry=registry, recorder=recorder, with_store=False, with_stats=False
        )
        server = await aiohttp_server(app)  # TestServer runs with handler_cancellation=True
        client: TestClient[web.Request, None] = await aiohttp_client(server)
        return Proxy(client, server, app, recorder, registry)

    return make
