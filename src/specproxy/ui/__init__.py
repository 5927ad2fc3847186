"""The live page, GET /ui: one static HTML file with its script and stylesheet, no build step.

The page polls GET /api/stats and renders the verdicts, speedups with their CIs, per-arm latency
and acceptance; GET /api/stats/history (`ui.history`) feeds its two SVG charts, the speedup over
time with its CI band and the latency per arm over time. Nothing comes from a CDN (the proxy may
run without internet). The files are read once when the routes are added, so serving them never
touches the disk on the event loop.
"""

from __future__ import annotations

import json
import time
from importlib import resources

from aiohttp import web

from specproxy.appkeys import CONFIG, STORE
from specproxy.ui.history import chart_points

__all__ = ["UI_FILES", "add_ui_routes"]

# file name -> content type; the only files /ui/{name} serves
UI_FILES: dict[str, str] = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
    "charts.js": "text/javascript",
}
HISTORY_DEFAULT_S = 3600.0  # GET /api/stats/history without ?since_s: the last hour


def add_ui_routes(app: web.Application) -> None:
    """GET /ui (the page) and GET /ui/{name} (its script and stylesheet)."""
    package = resources.files(__name__)
    files = {name: package.joinpath(name).read_bytes() for name in UI_FILES}

    async def page(request: web.Request) -> web.Response:
        return _response(files["index.html"], UI_FILES["index.html"])

    async def asset(request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if name not in files:
            raise web.HTTPNotFound(text=f"no such file: /ui/{name}")
        return _response(files[name], UI_FILES[name])

    async def history(request: web.Request) -> web.Response:
        store = request.app.get(STORE)
        if store is None:
            raise web.HTTPServiceUnavailable(text="no store: no stats history")
        try:
            since_s = float(request.query.get("since_s", HISTORY_DEFAULT_S))
        except ValueError:
            raise web.HTTPBadRequest(text="since_s must be a number of seconds") from None
        rows = await store.read_stats_history(
            run_id=request.app[CONFIG].run_id, since=time.time() - since_s
        )
        points = chart_points(rows)
        return web.Response(body=json.dumps(points).encode(), content_type="application/json")

    app.router.add_get("/api/stats/history", history)
    app.router.add_get("/ui", page)
    app.router.add_get("/ui/", page)
    app.router.add_get("/ui/{name}", asset)


def _response(body: bytes, content_type: str) -> web.Response:
    return web.Response(
        body=body,
        content_type=content_type,
        charset="utf-8",
        headers={"cache-control": "no-cache"},
    )
