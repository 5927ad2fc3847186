"""The process that computes the statistics: `specproxy stats --follow`.

The proxy relays, records and serves the latest stored result (`follower`); this process
computes it, away from the request path. `specproxy serve` starts it as its child
(`[stats] compute = "child"`, `supervisor.StatsChild`), or it runs on its own beside the proxies
(`compute = "external"`: a Deployment with the proxies' config and store). Either way it opens
the store, asks every `stats.interval_s` whether it leads the run (`leader`: a PostgreSQL
advisory lock, or a flock beside the SQLite file), and while it leads runs `StatsJob.run_once`:
compute, append the result to the store's history, compact the rollups. A process that does not
lead waits for the next interval; when the leader dies another takes over within one.

With the arms in its config it also asks them which models they serve (`ServedModels`), so the
per-model results are keyed by the same bounded label the proxies' scrapers keep
(`fleet.models`); without them every model string found is its own label, as `specproxy stats`
computes once.

SIGTERM or SIGINT stops it cleanly (exit 0): the interval loop is cancelled, the store closed
and the leadership released; a tick computing in its thread finishes first (numpy cannot be
interrupted), which is the longest a stop takes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable

import aiohttp

from specproxy.config import Config
from specproxy.fleet.arms import Fleet
from specproxy.fleet.models import ModelLabels, parse_models
from specproxy.scrape.loop import describe_error, fetch_text
from specproxy.stats.job.leader import leadership_for
from specproxy.stats.job.runner import StatsJob
from specproxy.stats.job.settings import StatsSettings, arm_roles, ramp_of
from specproxy.store.factory import open_store
from specproxy.tasks import cancel_and_wait

__all__ = ["STATUS_FOLLOWER", "STATUS_LEADER", "ServedModels", "follow", "run_follow"]

log = logging.getLogger(__name__)

# One line per change of leadership on the status descriptor serve passes its child.
STATUS_LEADER = b"leader\n"
STATUS_FOLLOWER = b"follower\n"


class ServedModels:
    """The bounded model label (`fleet.models.ModelLabels`) of a process without the proxy's
    scraper: every `interval_s` it reads `/v1/models` of one answering endpoint per arm."""

    def __init__(self, cfg: Config, *, interval_s: float) -> None:
        self._fleet = Fleet(cfg)
        self._timeout_s = cfg.scrape.timeout_s
        self._interval_s = interval_s
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None

    def label(self, model: str) -> str:
        return self._fleet.labels.label(model)

    async def refresh(self) -> None:
        """Ask each arm's endpoints in turn until one lists its models."""
        assert self._session is not None, "start() first"
        served: list[str] = []
        for arm in self._fleet.arms:
            for url in self._fleet.endpoints(arm):
                try:
                    body = await fetch_text(
                        self._session, url + "/v1/models", timeout_s=self._timeout_s
                    )
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # the next endpoint, or the next interval
                    log.debug("stats: %s/v1/models unreadable: %s", url, describe_error(exc))
                    continue
                served += parse_models(body)
                break
        if served:
            self._fleet.labels.set_served(served)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.refresh()

    async def start(self) -> None:
        await self._fleet.start()
        self._session = aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar())
        await self.refresh()  # before the first tick
        self._task = asyncio.create_task(self._loop(), name="specproxy-stats-models")

    async def close(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        if self._session is not None:
            await self._session.close()
        await self._fleet.close()


async def follow(
    settings: StatsSettings,
    stop: asyncio.Event,
    *,
    on_leadership: Callable[[bool], None] | None = None,
) -> None:
    """Compute while leading, until `stop` is set."""
    run_id = settings.run_id or "default"
    store = open_store(settings.store, run_id=run_id)
    await store.start()
    served = None
    if settings.config is not None:
        served = ServedModels(settings.config, interval_s=settings.stats.interval_s)
    # the rows it folds (`fold_pending`) are rolled up by the proxies' bounded model label; with
    # no arms known, every model is `OTHER` (bounded, where the client's strings would not be)
    store.label_models(served.label if served is not None else ModelLabels().label)
    job = StatsJob(
        store,
        run_id=run_id,
        stats_cfg=settings.stats,
        warmup=settings.warmup,
        leadership=leadership_for(settings.store.url, run_id),
        model_label=served.label if served is not None else None,
        on_leadership=on_leadership,
        **arm_roles(settings),
        **ramp_of(settings.config),
    )
    try:
        if served is not None:
            await served.start()
        await job.start()
        log.info("stats: computing run %s every %g s", run_id, settings.stats.interval_s)
        await stop.wait()
    finally:
        await job.close()
        if served is not None:
            await served.close()
        await store.close()


def _status_writer(fd: int | None) -> Callable[[bool], None] | None:
    """Writes each change of leadership to `fd` (serve reads it for `specproxy_stats_leader`)."""
    if fd is None:
        return None
    os.set_inheritable(fd, False)  # not for whatever this process starts

    def write(leader: bool) -> None:
        with contextlib.suppress(OSError):  # the parent is gone: this process follows it
            os.write(fd, STATUS_LEADER if leader else STATUS_FOLLOWER)

    return write


def run_follow(settings: StatsSettings, *, status_fd: int | None = None) -> int:
    """`specproxy stats --follow`: compute until SIGTERM or SIGINT, then exit 0."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await follow(settings, stop, on_leadership=_status_writer(status_fd))

    asyncio.run(main())
    return 0
