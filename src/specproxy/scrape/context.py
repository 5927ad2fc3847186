"""The scraper's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

It scrapes every endpoint of the fleet (`FLEET`, set by the fleet's context, which starts first)
on the app's per-arm sessions (`app[SESSIONS]`), records into whatever `app[RECORDER]`
is once the store has started, exports on `app[REGISTRY]`, and publishes itself under `SCRAPER`
so that the stats job can ask for each arm's restart times. The optional dcgm-exporter scrape
runs beside it (`GPU_SCRAPER`, idle without `dcgm_urls`), recording into the same recorder when
it takes GPU samples (the store does; the in-memory ring of a proxy without a store does not).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, FLEET, GPU_SCRAPER, RECORDER, REGISTRY, SCRAPER, SESSIONS
from specproxy.records import GpuRecorder
from specproxy.scrape.collector import register_engine_collector
from specproxy.scrape.dcgmcollector import register_gpu_collector
from specproxy.scrape.dcgmloop import GpuScraper
from specproxy.scrape.loop import EngineScraper

__all__ = ["scrape_ctx"]


async def scrape_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start scraping when the app starts; stop (cancel the tasks) when it shuts down."""
    sessions = app[SESSIONS]
    scraper = EngineScraper(app[CONFIG], sessions, app[RECORDER], fleet=app.get(FLEET))
    recorder = app[RECORDER]
    gpus = GpuScraper(
        app[CONFIG], sessions, recorder if isinstance(recorder, GpuRecorder) else None
    )
    collectors = (
        register_engine_collector(app[REGISTRY], scraper.states),
        register_gpu_collector(app[REGISTRY], gpus.states),
    )
    app[SCRAPER], app[GPU_SCRAPER] = scraper, gpus
    await scraper.start()
    await gpus.start()
    try:
        yield
    finally:
        await gpus.close()
        await scraper.close()
        for collector in collectors:
            app[REGISTRY].unregister(collector)
