"""The aiohttp application, and the one place where the proxy's components are put together.

`create_app(cfg, registry=..., recorder=..., with_store=..., with_stats=...)` builds an
`Application` whose shared objects live under the typed keys of `specproxy.appkeys` (what each
key holds is listed there). The components read those keys and never import this module, so this
is the only composition root.

Start order (aiohttp runs every cleanup_ctx before the on_startup hook that builds the
forwarder, and runs the on_shutdown hook that stops it, cancelling shadows, which still write
their records, before any cleanup_ctx unwinds):

1. upstream sessions (`SESSIONS`);
2. store (`specproxy.store.context`, `with_store=True`): opens `cfg.store`, sets `STORE` and makes
   it the `RECORDER`; closes (flushes) last, after the last record was handed over;
3. fleet (`specproxy.fleet.context`): every arm's endpoint pool and DNS discovery (`FLEET`);
4. scraper (`specproxy.scrape.context`): polls each arm's /metrics on `SESSIONS`, records engine
   samples into `RECORDER`;
5. arm control (`specproxy.control.context`, with the store): folds the stored arm events into the
   app's `ROUTER` before the first request and polls for new ones (`CONTROL`);
6. statistics (`specproxy.stats.context`, `with_stats=True`, needs the store): follows the
   results the stats process stores in `STORE` (and starts that process with
   `[stats] compute = "child"`; on memory:// the job runs here); sets `STATS`, until a result
   exists GET /api/stats answers 503;
7. forwarder (on_startup): the request path, recording into whatever `RECORDER` is by then.

A new component is one cleanup_ctx appended at the marked spot in `create_app`, reading and
setting keys it declares in `specproxy.appkeys`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import ClientError, ClientSession, ClientTimeout, DummyCookieJar, TCPConnector, web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from specproxy.admin import admin_guard
from specproxy.appkeys import (
    ADMIN_GUARDED,
    CONFIG,
    FLEET,
    FORWARDER,
    METRICS,
    METRICS_VIEW,
    RECORDER,
    REGISTRY,
    ROUTER,
    SCRAPER,
    SESSIONS,
    STATS,
)
from specproxy.config import Config
from specproxy.control.api import add_control_routes
from specproxy.control.context import control_ctx
from specproxy.errors import error_body
from specproxy.fleet.context import fleet_ctx
from specproxy.metrics import ProxyMetrics
from specproxy.proxy.lifecycle import MEASURED_ENDPOINTS, Forwarder
from specproxy.proxy.limits import (
    PARSER_MAX_HEADERS,
    PARSER_MAX_LINE_BYTES,
    quiet_parser_rejections,
)
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.proxy.routing import router_of
from specproxy.proxy.timeouts import ArmTimeouts
from specproxy.records import Arm, Recorder
from specproxy.scrape.context import scrape_ctx
from specproxy.stats.context import stats_ctx
from specproxy.stats.result import to_json
from specproxy.store.context import store_ctx
from specproxy.ui import add_ui_routes

__all__ = ["create_app", "upstream_session"]

_READY_TIMEOUT_S = 2.0


def create_app(
    cfg: Config,
    *,
    registry: CollectorRegistry | None = None,
    recorder: Recorder | None = None,
    with_store: bool = True,
    with_stats: bool = True,
    admin_token: str | None = None,
) -> web.Application:
    """The proxy application for `cfg`; nothing is connected until it starts.

    `with_store` opens `cfg.store` and records into it; a test or benchmark that wants records
    somewhere else passes `recorder=` with `with_store=False` (without either, records go to an
    in-memory ring). `with_stats` serves the statistics of that store (`stats.context`: the
    stats process's stored results; on memory:// the job itself). Asking for a store
    and an injected recorder at once, or for stats without a store, is a `ValueError`: neither
    is switched off behind the caller's back. With an `admin_token` (`specproxy.admin`), the
    proxy's own surfaces need it; /v1/* never does.
    """
    if recorder is not None and with_store:
        raise ValueError("recorder= replaces the store: pass with_store=False with it")
    if with_stats and not with_store:
        raise ValueError("the stats job reads the store: with_stats=True needs with_store=True")
    quiet_parser_rejections()  # a malformed request is the client's error, not a traceback
    middlewares = []
    if admin_token is not None:
        middlewares.append(admin_guard(admin_token, protect_metrics=cfg.protect_metrics))
    app = web.Application(
        middlewares=middlewares,
        client_max_size=cfg.max_body_bytes,
        # aiohttp's own parser bounds (one line, header lines), above proxy.limits' JSON 431.
        handler_args={
            "max_line_size": PARSER_MAX_LINE_BYTES,
            "max_field_size": PARSER_MAX_LINE_BYTES,
            "max_headers": PARSER_MAX_HEADERS,
        },
    )
    app[CONFIG] = cfg
    app[REGISTRY] = registry if registry is not None else CollectorRegistry()
    app[METRICS] = ProxyMetrics(app[REGISTRY])
    app[RECORDER] = recorder if recorder is not None else MemoryRecorder()
    app[ROUTER] = router_of(cfg)
    app[ADMIN_GUARDED] = admin_token is not None

    app.cleanup_ctx.append(_upstream_sessions)
    # ---- Extension point: components append their cleanup_ctx here, in start order. ----
    if with_store:
        app.cleanup_ctx.append(store_ctx)  # sets STORE and RECORDER; closes (flushes) last
        app.cleanup_ctx.append(control_ctx)  # stored arm events -> ROUTER, polled: CONTROL
    app.cleanup_ctx.append(fleet_ctx)  # every arm's endpoint pool (+ DNS discovery): FLEET
    app.cleanup_ctx.append(scrape_ctx)  # each arm's /metrics (+ dcgm-exporters) via SESSIONS
    if with_stats:
        app.cleanup_ctx.append(stats_ctx)  # stored results (+ the stats process); sets STATS
    # The forwarder reads RECORDER after every cleanup_ctx has started, and stops first.
    app.on_startup.append(_start_forwarder)
    app.on_shutdown.append(_stop_forwarder)

    for path in MEASURED_ENDPOINTS:
        app.router.add_post(path, _measured)
    app.router.add_route("*", "/v1/{tail:.*}", _passthrough)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/api/stats", _stats)
    add_ui_routes(app)  # GET /ui: the live page polling /api/stats
    add_control_routes(app)  # GET /api/arms, POST /api/arms/{name}, POST /api/experiment
    return app


def upstream_session(cfg: Config, arm: Arm) -> ClientSession:
    """A pooled session for one arm: no pool cap, no cookies, no decompression; the arm's stream
    timeouts by default (non-streaming and pass-through calls pass their own, `ArmTimeouts`)."""
    return ClientSession(
        connector=TCPConnector(limit=0, limit_per_host=0),
        cookie_jar=DummyCookieJar(),
        auto_decompress=False,
        timeout=ArmTimeouts.of(cfg.arm_timeouts(arm)).stream,
        # Forward exactly the client's headers: add none of aiohttp's defaults.
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
    )


async def _upstream_sessions(app: web.Application) -> AsyncIterator[None]:
    cfg = app[CONFIG]
    app[SESSIONS] = {arm: upstream_session(cfg, arm) for arm in cfg.arm_names}
    yield
    await asyncio.gather(*(session.close() for session in app[SESSIONS].values()))


async def _start_forwarder(app: web.Application) -> None:
    sessions = app[SESSIONS]
    app[FORWARDER] = Forwarder(
        app[CONFIG],
        sessions=sessions,
        recorder=app[RECORDER],
        metrics=app[METRICS],
        fleet=app.get(FLEET),
        router=app[ROUTER],
        engine_load=scraper.engine_load if (scraper := app.get(SCRAPER)) is not None else None,
    )


async def _stop_forwarder(app: web.Application) -> None:
    forwarder = app.get(FORWARDER)
    if forwarder is not None:
        await forwarder.close()


async def _measured(request: web.Request) -> web.StreamResponse:
    return await request.app[FORWARDER].measured(request)


async def _passthrough(request: web.Request) -> web.StreamResponse:
    return await request.app[FORWARDER].passthrough(request)


async def _metrics(request: web.Request) -> web.Response:
    forwarder = request.app.get(FORWARDER)
    if forwarder is not None:
        forwarder.settle()  # the collect below runs in a thread, past the barrier's reach
    view = request.app.get(METRICS_VIEW)
    if view is not None and "local" not in request.query:
        body = await view()  # every worker's registry, merged
    else:
        body = await asyncio.to_thread(generate_latest, request.app[REGISTRY])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def _readyz(request: web.Request) -> web.Response:
    """Ready when the control arm (baseline) can serve: one of its endpoints answers /health (an
    arm is a pool: one live engine is enough). `arms` says which arm can serve; a fail-open
    treatment whose every endpoint is ejected cannot, until a probe readmits one.

    A treatment arm that is down is no readiness failure when it fails open (`on_down =
    "control"`, the default): its requests go to the control, so the replica still serves every
    client; it is listed in `degraded` (and `specproxy_arm_up` and the SpecProxyTreatmentArmDown
    alert say so). With `on_down = "error"` a treatment is needed as before.

    The control down and a treatment up is not ready (503), and the control's requests are not
    sent to the treatment: moving all production traffic onto an unproven configuration without
    anyone deciding to would make the experiment the product. Kubernetes takes the replica out of
    the Service instead, which is the outage the stable configuration alone would have had.
    """
    app = request.app
    cfg = app[CONFIG]
    arms = cfg.arm_names
    fleet = app.get(FLEET)

    def fails_open(arm: Arm) -> bool:
        return arm != cfg.control_arm and cfg.arm_config(arm).on_down == "control"

    async def arm_ready(arm: Arm) -> bool:
        if fleet is not None and fails_open(arm) and fleet.pool(arm).down:
            return False  # its requests go to the control until a probe readmits an endpoint
        urls = fleet.endpoints(arm) if fleet is not None else (cfg.upstream_url(arm),)
        session = app[SESSIONS][arm]
        answers = await asyncio.gather(*(_reachable(session, url + "/health") for url in urls))
        return any(answers)

    results = await asyncio.gather(*(arm_ready(arm) for arm in arms))
    arm_status = {arm: ok for arm, ok in zip(arms, results, strict=True)}

    ready = all(ok for arm, ok in zip(arms, results, strict=True) if not fails_open(arm))
    degraded = [a for a, ok in zip(arms, results, strict=True) if not ok and fails_open(a)]
    return web.json_response(
        {"ready": ready, "arms": arm_status, "degraded": degraded}, status=200 if ready else 503
    )


async def _reachable(session: ClientSession, url: str) -> bool:
    try:
        async with session.get(url, timeout=ClientTimeout(total=_READY_TIMEOUT_S)) as resp:
            await resp.read()
            return resp.status < 500
    except (ClientError, TimeoutError):
        return False


async def _stats(request: web.Request) -> web.Response:
    provider = request.app.get(STATS)
    result = provider() if provider is not None else None
    if result is None:
        message = "no statistics yet" if provider is not None else "the stats job is not running"
        return web.Response(
            body=error_body(message, status=503, error_type="ServiceUnavailable"),
            status=503,
            content_type="application/json",
        )
    return web.Response(body=to_json(result).encode(), content_type="application/json")
