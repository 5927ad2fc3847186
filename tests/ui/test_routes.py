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


async def test_history_serves_chart_points_from_the_store(aiohttp_client: AiohttpClient) -> None:
    import time

    from specproxy.appkeys import CONFIG, STORE
    from specproxy.config import Config, StoreConfig
    from specproxy.store.memory import MemoryStore
    from tests.ui.test_history import result

    app = web.Application()
    cfg = Config(baseline_url="http://b", speculative_url="http://s", run_id="r1")
    store = MemoryStore(StoreConfig(url="memory://"), run_id="r1")
    await store.start()
    now = time.time()
    await store.write_stats(run_id="r1", t=now - 7200, result=result(1.1))  # too old
    await store.write_stats(run_id="r1", t=now - 10, result=result(1.5))
    await store.write_stats(run_id="other", t=now - 5, result=result(9.0))  # another run
    app[CONFIG], app[STORE] = cfg, store
    add_ui_routes(app)
    client = await aiohttp_client(app)
    points = await (await client.get("/api/stats/history")).json()
    assert [p["speedup"]["e2e"]["median"][0] for p in points] == [1.5]
    longer = await (await client.get("/api/stats/history?since_s=10000")).json()
    assert [p["speedup"]["e2e"]["median"][0] for p in longer] == [1.1, 1.5]
    assert (await client.get("/api/stats/history?since_s=x")).status == 400
    js = await (await client.get("/ui/charts.js")).text()
    assert "/api/stats/history" in js and "createElementNS" in js  # plain SVG, no library
    await store.close()


async def test_history_without_a_store_is_503(aiohttp_client: AiohttpClient) -> None:
    app = web.Application()
    add_ui_routes(app)
    client = await aiohttp_client(app)
    assert (await client.get("/api/stats/history")).status == 503
