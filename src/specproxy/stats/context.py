"""The stats job's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

It runs the periodic comparison on the app's store (`STORE`, set by the store's context, which
starts first), publishes its gauges on the app's registry, and makes `GET /api/stats` serve the
latest result by setting `app[STATS]`. Replicas sharing the store elect one leader that
computes (`leader.leadership_for`); the others serve what it stored. Without a store (a
recorder injected in tests) there is nothing to compute from, so it stays idle and /api/stats
keeps answering 503.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.stats.job import StatsJob
from specproxy.stats.leader import leadership_for

__all__ = ["STATS_JOB", "stats_ctx"]

STATS_JOB = web.AppKey("stats_job", StatsJob)


async def stats_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the job with the app; cancel it before the store closes."""
    # Imported here, not at module level: specproxy.app imports this module to wire it in.
    from specproxy.app import CONFIG, REGISTRY, STATS
    from specproxy.store.context import STORE

    store = app.get(STORE)
    if store is None or app.get(STATS) is not None:
        yield
        return
    cfg = app[CONFIG]
    job = StatsJob(
        store,
        run_id=cfg.run_id,
        stats_cfg=cfg.stats,
        scrape_cfg=cfg.scrape,
        registry=app[REGISTRY],
        leadership=leadership_for(cfg.store.url, cfg.run_id),
    )
    app[STATS_JOB] = job
    app[STATS] = job.latest
    await job.start()
    try:
        yield
    finally:
        await job.close()
