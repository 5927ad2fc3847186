"""GET /ui serves the static page, its script and stylesheet, and nothing else."""

from __future__ import annotations

from aiohttp import web
from pytest_aiohttp import AiohttpClient

from specproxy.ui import UI_FILES, add_ui_routes


async def test_page_and_assets(aiohttp_client: AiohttpClient) -> None:
    app = web.Application()
    add_ui_routes(app)
    client = await aiohttp_client(app)
    page = await client.get("/ui")
    assert page.status == 200 and page.content_type == "text/html"
    html = await page.text()
    assert "/ui/app.js" in html and "/ui/style.css" in html
    assert "http" not in html.replace("http-equiv", "")  # nothing from a CDN
    for name, content_type in UI_FILES.items():
        resp = await client.get(f"/ui/{name}")
        assert resp.status == 200 and resp.content_type == content_type
    js = await (await client.get("/ui/app.js")).text()
    assert "/api/stats" in js
    missing = await client.get("/ui/../app.py")
    assert missing.status == 404
    assert (await client.get("/ui/secret.txt")).status == 404
