"""The proxy application's shared objects, each under one typed `web.AppKey`.

A leaf module (aiohttp keeps `AppKey` in `helpers.py` for the same reason): it imports nothing of
specproxy at run time, only for type checking, so every component's cleanup_ctx (store, scraper,
stats job) and every embedder (demo, tests) reads the keys from here, and `specproxy.app`, the
one composition root, imports the components without any of them importing it back.

Set by `create_app` before the app starts:
    CONFIG     the validated `Config`
    REGISTRY   the injected prometheus `CollectorRegistry` (served at GET /metrics)
    METRICS    the proxy's `ProxyMetrics` on that registry
    RECORDER   where finished `RequestRecord`s go (an in-memory ring, an injected recorder, or
               the store once it has started)
    ROUTER     the request path's `Router`, whose share runtime arm control changes
    ADMIN_GUARDED  whether an admin token guards the admin surfaces (`specproxy.admin`)
Set while the app starts (cleanup_ctx, in this order), then read by the later ones:
    SESSIONS   {Arm: ClientSession}, one pooled session per upstream for the app's life
    STORE      the open store (only `with_store=True`)
    CONTROL    the replica's arm state, polled from the store (`control.live`; with the store)
    FLEET      every arm's endpoint pool and its DNS discovery (a test may set it before start)
    SCRAPER    the engine scraper (its per-arm states and restart times)
    GPU_SCRAPER  the dcgm-exporter scraper (latest GPU sample per arm; idle without dcgm_urls)
    STATS_JOB  the stats job computing inside the proxy (only `with_stats=True` on memory://;
               on other stores a separate process computes, `stats.job.process`)
    STATS      a zero-argument callable returning the latest stats result (GET /api/stats)
Set in on_startup, after every cleanup_ctx has started:
    FORWARDER  the request path
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from aiohttp import web

if TYPE_CHECKING:
    from aiohttp import ClientSession
    from prometheus_client import CollectorRegistry

    from specproxy.config import Config
    from specproxy.control.live import ArmControl
    from specproxy.fleet.arms import Fleet
    from specproxy.metrics import ProxyMetrics
    from specproxy.proxy.lifecycle import Forwarder
    from specproxy.proxy.routing import Router
    from specproxy.records import Arm, Recorder
    from specproxy.scrape.dcgmloop import GpuScraper
    from specproxy.scrape.loop import EngineScraper
    from specproxy.stats.job.runner import StatsJob
    from specproxy.stats.result import StatsResult
    from specproxy.store.buffered import BufferedStore

__all__ = [
    "ADMIN_GUARDED",
    "CONFIG",
    "CONTROL",
    "FLEET",
    "FORWARDER",
    "GPU_SCRAPER",
    "METRICS",
    "METRICS_VIEW",
    "RECORDER",
    "REGISTRY",
    "ROUTER",
    "SCRAPER",
    "SESSIONS",
    "STATS",
    "STATS_JOB",
    "STORE",
    "StatsProvider",
]

StatsProvider = Callable[[], "StatsResult | None"]

CONFIG: web.AppKey[Config] = web.AppKey("config")
REGISTRY: web.AppKey[CollectorRegistry] = web.AppKey("registry")
METRICS: web.AppKey[ProxyMetrics] = web.AppKey("metrics")
RECORDER: web.AppKey[Recorder] = web.AppKey("recorder")
SESSIONS: web.AppKey[dict[Arm, ClientSession]] = web.AppKey("sessions")
STORE: web.AppKey[BufferedStore] = web.AppKey("store")
FLEET: web.AppKey[Fleet] = web.AppKey("fleet")
SCRAPER: web.AppKey[EngineScraper] = web.AppKey("scraper")
GPU_SCRAPER: web.AppKey[GpuScraper] = web.AppKey("gpu_scraper")
STATS_JOB: web.AppKey[StatsJob] = web.AppKey("stats_job")
STATS: web.AppKey[StatsProvider] = web.AppKey("stats")
FORWARDER: web.AppKey[Forwarder] = web.AppKey("forwarder")
ROUTER: web.AppKey[Router] = web.AppKey("router")
ADMIN_GUARDED: web.AppKey[bool] = web.AppKey("admin_guarded")
CONTROL: web.AppKey[ArmControl] = web.AppKey("control")
# `serve --workers N`: GET /metrics answers with this instead of the own registry (every
# worker's page merged, `fleet.workers`); `?local=1` still reads the own registry.
METRICS_VIEW: web.AppKey[Callable[[], Awaitable[bytes]]] = web.AppKey("metrics_view")
