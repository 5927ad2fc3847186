"""Fixtures of the real-engine tier: two real vLLM CPU servers, started once for the package.

`$SPECPROXY_VLLM_PYTHON` names the vLLM venv's python (`make vllm-env` builds it). Without it
the tier fails in CI (CI set) and skips elsewhere. For iterating on the tier by hand,
`$SPECPROXY_VLLM_ATTACH="SPEC_URL BASE_URL"` reuses servers started with `specproxy vllm`
(tests that restart an engine are skipped then). Tests that restart an engine run last, so that
no other test meets a cold engine.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from specproxy.app import create_app
from specproxy.config import (
    ArmConfig,
    Config,
    OnDown,
    RoutingConfig,
    ScrapeConfig,
    StatsConfig,
    StoreConfig,
    WarmupConfig,
)
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.realvllm.launcher import VllmPair
from specproxy.realvllm.model_dir import SERVED_MODEL_NAME
from specproxy.realvllm.workload import completion_body, prompts
from specproxy.records import Arm

MODEL = SERVED_MODEL_NAME
RESTART_FILES = ("/test_restart.py",)  # their tests restart an engine: run them last


@dataclass
class Engines:
    """Base URLs of the two real servers, and the pair that owns them (None when attached)."""

    urls: dict[Arm, str]
    pair: VllmPair | None

    @property
    def speculative_url(self) -> str:
        return self.urls["speculative"]

    @property
    def baseline_url(self) -> str:
        return self.urls["baseline"]


@dataclass
class Proxy:
    """A specproxy app in front of the real servers, served in-process on a free port."""

    url: str
    app: web.Application
    recorder: MemoryRecorder
    registry: CollectorRegistry


MakeProxy = Callable[..., Awaitable[Proxy]]
MakeStatsApp = Callable[[str, ScrapeConfig], Awaitable[tuple[web.Application, str]]]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests that restart an engine to the end of this package's tests."""
    slots = [i for i, item in enumerate(items) if "realvllm/" in item.nodeid.split("::")[0]]
    group = sorted(
        (items[i] for i in slots), key=lambda it: it.nodeid.split("::")[0].endswith(RESTART_FILES)
    )
    for slot, item in zip(slots, group, strict=True):
        items[slot] = item


def _post(url: str, body: dict[str, Any]) -> None:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=120) as resp:
        resp.read()


def warm_up(urls: dict[Arm, str], rounds: int = 3) -> None:
    """The first requests compile kernels (seconds each): pay that before any test measures."""
    for prompt in prompts(rounds, seed=99):
        for url in urls.values():
            _post(f"{url}/v1/completions", completion_body(prompt, max_tokens=64))
            chat = {
                "model": MODEL,
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 16,
                "temperature": 0.0,
            }
            _post(f"{url}/v1/chat/completions", chat)


@pytest.fixture(scope="package")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    attach = os.environ.get("SPECPROXY_VLLM_ATTACH")
    if attach:
        spec_url, base_url = attach.split()
        yield Engines({"speculative": spec_url, "baseline": base_url}, None)
        return
    python = os.environ.get("SPECPROXY_VLLM_PYTHON")
    if not python:
        message = "SPECPROXY_VLLM_PYTHON is not set (run `make vllm-env`, then point it there)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    log_dir = Path(os.environ.get("SPECPROXY_VLLM_LOG_DIR") or tmp_path_factory.mktemp("vllm"))
    with VllmPair(Path(python), log_dir=log_dir) as pair:
        urls = {arm: pair.url(arm) for arm in ("speculative", "baseline")}
        warm_up(urls)
        yield Engines(urls, pair)


@pytest.fixture
def make_proxy(engines: Engines, aiohttp_server: AiohttpServer) -> MakeProxy:
    """Build a proxy over the real servers; `allow_forced_arm` lets a test pick the arm."""

    async def make(
        *,
        scrape_interval_s: float = 3600.0,
        urls: dict[Arm, str] | None = None,
        warmup: dict[str, Any] | None = None,
        on_down: OnDown = "control",
        **routing: Any,
    ) -> Proxy:
        upstream = urls or engines.urls
        cfg = Config(
            baseline_url=upstream["baseline"],
            speculative_url=upstream["speculative"],
            speculative=ArmConfig(on_down=on_down),
            routing=RoutingConfig(**{"allow_forced_arm": True, "seed": 0, **routing}),
            scrape=ScrapeConfig(interval_s=scrape_interval_s),
            warmup=WarmupConfig(**{"restart_seconds": 0.0, **(warmup or {})}),
        )
        registry = CollectorRegistry()
        recorder = MemoryRecorder()
        app = create_app(
            cfg, registry=registry, recorder=recorder, with_store=False, with_stats=False
        )
        server = await aiohttp_server(app)
        return Proxy(str(server.make_url("")).rstrip("/"), app, recorder, registry)

    return make


@pytest.fixture
async def proxy(make_proxy: MakeProxy) -> AsyncIterator[Proxy]:
    yield await make_proxy()


@pytest.fixture
def make_stats_app(engines: Engines, aiohttp_server: AiohttpServer) -> MakeStatsApp:
    """The whole app over the real servers (memory store, scraper, stats job), served on a free
    port: returns it and its URL. Its stats job runs once at start-up (empty), then waits out
    the hour, so the only later run is the one a test asks for (`STATS_JOB.run_once`)."""

    async def make(run_id: str, scrape: ScrapeConfig) -> tuple[web.Application, str]:
        cfg = Config(
            baseline_url=engines.baseline_url,
            speculative_url=engines.speculative_url,
            run_id=run_id,
            routing=RoutingConfig(allow_forced_arm=True),
            store=StoreConfig(url="memory://"),
            scrape=scrape,
            stats=StatsConfig(interval_s=3600.0, windows_s=(None,), resamples=2000),
            warmup=WarmupConfig(requests=0, restart_seconds=0.0),
        )
        app = create_app(cfg, registry=CollectorRegistry())
        return app, str((await aiohttp_server(app)).make_url("")).rstrip("/")

    return make
