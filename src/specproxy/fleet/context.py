"""The fleet's place in the proxy's life cycle: one `app.cleanup_ctx` entry, before the scraper.

It builds the `Fleet` from the config, resolves the DNS arms once before the app serves, and
publishes it under `FLEET` for the request path and the scraper; discovery stops on exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, FLEET, METRICS
from specproxy.fleet.arms import Fleet

__all__ = ["fleet_ctx"]


async def fleet_ctx(app: web.Application) -> AsyncIterator[None]:
    if FLEET not in app:  # a fleet injected before start (tests: a controlled resolver) wins
        events = app[METRICS].endpoint_events

        def count(arm: str, event: str, url: str) -> None:
            events.labels(arm=arm, event=event).inc()

        app[FLEET] = Fleet(app[CONFIG], on_endpoint_event=count)
    fleet = app[FLEET]
    await fleet.start()
    try:
        yield
    finally:
        await fleet.close()
