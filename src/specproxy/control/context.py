"""Runtime arm control's place in the proxy's life cycle: one `app.cleanup_ctx` entry.

`create_app(..., with_store=True)` adds it after the store. It builds the replica's
`control.live.ArmControl` over the store and the app's `ROUTER`, folds every stored arm event
of the run before the forwarder takes its first request (a restart keeps a stop), publishes it
under `CONTROL` for the admin API (`control.api`), and polls the store every `[control] poll_s`
until the app shuts down. With `serve --workers N` each worker runs its own: every worker reads
the same store, so each applies a change within the same bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from aiohttp import web

from specproxy.appkeys import CONFIG, CONTROL, METRICS, ROUTER, STORE
from specproxy.control.live import ArmControl
from specproxy.tasks import cancel_and_wait

__all__ = ["control_ctx"]


async def control_ctx(app: web.Application) -> AsyncIterator[None]:
    """Fold the stored events, then poll for new ones until shutdown."""
    cfg = app[CONFIG]
    shares = cfg.arm_shares()
    control = ArmControl(
        run_id=cfg.run_id,
        configured={arm: shares[arm] for arm in cfg.treatment_arms},
        control=cfg.control_arm,
        store=app[STORE],
        router=app[ROUTER],
        metrics=app[METRICS],
    )
    await control.poll()  # every event of the run; on failure the configured state, polled again
    app[CONTROL] = control
    task = asyncio.create_task(_poll_forever(control, cfg.control.poll_s), name="specproxy-control")
    try:
        yield
    finally:
        await cancel_and_wait(task)


async def _poll_forever(control: ArmControl, interval_s: float) -> None:
    while True:
        await asyncio.sleep(interval_s)
        await control.poll()
