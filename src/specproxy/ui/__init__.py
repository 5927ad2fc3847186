"""The live page, GET /ui: one static HTML file with its script and stylesheet, no build step.

The page polls GET /api/stats and renders the verdicts, speedups with their CIs, per-arm latency
and acceptance. Nothing comes from a CDN (the proxy may run without internet). The three files are
read once when the routes are added, so serving them never touches the disk on the event loop.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

__all__ = ["UI_FILES", "add_ui_routes"]

# file name -> content type; the only files /ui/{name} serves
UI_FILES: dict[str, str] = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
}


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
