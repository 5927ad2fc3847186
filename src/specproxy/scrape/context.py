"""The scraper's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

It scrapes every endpoint of the fleet (`FLEET`, set by the fleet's context, which starts first)
on the app's per-arm sessions (`app[SESSIONS]`), records into whatever `app[RECORDER]`
is once the store has started, exports on `app[REGISTRY]`, and publishes itself under `SCRAPER`
so that the stats job can ask for each arm's restart times.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, FLEET, RECORDER, REGISTRY, SCRAPER, SESSIONS
from specproxy.scrape.collector import register_engine_collector
from specproxy.scrape.loop import EngineScraper

__all__ = ["scrape_ctx"]


async def scrape_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start scraping when the app starts; stop (cancel the task) when it shuts down."""
    sessions = app[SESSIONS]
    scraper = EngineScraper(app[CONFIG], sessions, app[RECORDER], fleet=app.get(FLEET))
    collector = register_engine_collector(app[REGISTRY], scraper.states)
    app[SCRAPER] = scraper
    await scraper.start()
    try:
        yield
    finally:
        await scraper.close()
        app[REGISTRY].unregister(collector)
