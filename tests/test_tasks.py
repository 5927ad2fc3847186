from __future__ import annotations

import asyncio

from specproxy.tasks import cancel_and_wait


async def test_cancel_and_wait_stops_the_task_and_swallows_its_cancellation() -> None:
    stopped = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            stopped.set()

    task = asyncio.create_task(forever())
    await asyncio.sleep(0)
    await cancel_and_wait(task)
    assert task.cancelled() and stopped.is_set()
    await cancel_and_wait(None)  # nothing started: nothing to do
