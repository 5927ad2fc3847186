"""The stats job's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

`create_app(..., with_stats=True)` adds it (which needs `with_store=True`: the job reads the
app's store, `STORE`, set by the store's context, which starts first). It publishes the job's
gauges on the app's registry, makes `GET /api/stats` serve the latest result by setting
`app[STATS]`, and cancels the job before the store closes. Replicas sharing the store elect one
leader that computes (`leader.leadership_for`); the others serve what it stored. The job reads
the GPU samples from the store like everything else (`Store.read_gpu_samples`), so a new leader
sees the GPU history its predecessors' scrapers wrote.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, FLEET, REGISTRY, STATS, STATS_JOB, STORE
from specproxy.stats.job.leader import leadership_for
from specproxy.stats.job.runner import StatsJob

__all__ = ["stats_ctx"]


async def stats_ctx(app: web.Application) -> AsyncIterator[None]:
    """Start the job with the app; cancel it before the store closes."""
    cfg = app[CONFIG]
    job = StatsJob(
        app[STORE],
        run_id=cfg.run_id,
        stats_cfg=cfg.stats,
        warmup=cfg.warmup,
        registry=app[REGISTRY],
        leadership=leadership_for(cfg.store.url, cfg.run_id),
        model_label=app[FLEET].labels.label if FLEET in app else None,
    )
    app[STATS_JOB] = job
    app[STATS] = job.latest
    await job.start()
    try:
        yield
    finally:
        await job.close()
