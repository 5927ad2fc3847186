"""The statistics' place in the proxy's life cycle: one `app.cleanup_ctx` entry.

`create_app(..., with_stats=True)` adds it (which needs `with_store=True`: it reads the app's
store, `STORE`, set by the store's context, which starts first). It makes `GET /api/stats`,
`/ui` and the stats gauges serve the latest result by setting `app[STATS]`, and stops before
the store closes.

The proxy computes nothing. Its follower (`job.follower.StatsFollower`) polls the store's history
every `stats.interval_s` for the newest result the computing process stored. With
`[stats] compute = "child"` this context also starts that process (`job.supervisor.StatsChild`,
`specproxy stats --follow`) and stops it on exit; with "external" another process computes
(`serve --workers N` runs its workers as "external": their parent starts the one child).
Nothing on this path imports numpy or scipy.

A `memory://` store is the exception: no other process can read it, so the job runs here, in
this process (`job.runner.StatsJob`, imported only then), whatever `compute` says.

`specproxy_stats_leader` is 1 in the proxy whose stats process holds the run's leader lock (its
child reports it; on memory:// the proxy itself), 0 in a proxy whose statistics are external,
absent while unknown.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from aiohttp import web

from specproxy.appkeys import CONFIG, FLEET, REGISTRY, STATS, STATS_JOB, STORE
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.follower import StatsFollower
from specproxy.stats.job.supervisor import POLL_S, StatsChild, needs_stats_process
from specproxy.tasks import cancel_and_wait

__all__ = ["stats_ctx"]

log = logging.getLogger(__name__)


async def stats_ctx(app: web.Application) -> AsyncIterator[None]:
    """Follow (and start the stats process) or, on memory://, compute; stop before the store."""
    cfg = app[CONFIG]
    if cfg.store.url.startswith("memory:"):
        async for _ in _inline_job(app):
            yield
        return
    follower = StatsFollower(app[STORE], run_id=cfg.run_id, interval_s=cfg.stats.interval_s)
    child = StatsChild(cfg) if needs_stats_process(cfg) else None
    leader: Callable[[], bool | None] = child.is_leader if child is not None else lambda: False
    register_stats_collector(app[REGISTRY], follower.latest, leader)
    app[STATS] = follower.latest
    watch = asyncio.create_task(_watch(child), name="specproxy-stats-child") if child else None
    await follower.start()
    try:
        yield
    finally:
        await follower.close()
        await cancel_and_wait(watch)
        if child is not None:
            await child.aclose()


async def _watch(child: StatsChild) -> None:
    while True:
        try:
            child.poll()
        except Exception:  # never the proxy's failure
            log.exception("stats: watching the stats process failed")
        await asyncio.sleep(POLL_S)


async def _inline_job(app: web.Application) -> AsyncIterator[None]:
    from specproxy.stats.job.runner import StatsJob  # numpy: only for an inline job
    from specproxy.stats.job.settings import ramp_of

    cfg = app[CONFIG]
    job = StatsJob(
        app[STORE],
        run_id=cfg.run_id,
        stats_cfg=cfg.stats,
        warmup=cfg.warmup,
        registry=app[REGISTRY],
        model_label=app[FLEET].labels.label if FLEET in app else None,
        control=cfg.control_arm,
        treatments=cfg.treatment_arms,
        labels=cfg.arm_labels,
        **ramp_of(cfg),
    )
    app[STATS_JOB] = job
    app[STATS] = job.latest
    await job.start()
    try:
        yield
    finally:
        await job.close()
