"""Mirrored ("shadow") calls: the same request sent to the other arm, read fully, never returned.

A shadow runs as its own task, capped at `max_concurrent_shadows` (over the cap it is skipped and
counted, never queued; so is a shadow to an arm that is down: every endpoint ejected), and ends in
one record with `shadow=True` and the primary's `pair_id`.
Shutdown cancels the shadows still running; each still writes its record.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from specproxy.errors import ErrorKind, UpstreamError
from specproxy.proxy.conditions import temperature_of
from specproxy.proxy.endpoints import Upstreams
from specproxy.proxy.headers import OutboundHeaders, is_event_stream
from specproxy.proxy.sse import SSEScanner
from specproxy.proxy.trace import STATUS_CLIENT_GONE, RequestIds, Trace
from specproxy.proxy.transports.base import Reply
from specproxy.proxy.transports.select import Mode
from specproxy.proxy.usage import should_inject, usage_of, with_usage
from specproxy.records import Arm

__all__ = ["Shadows"]


class Shadows:
    """Starts, tracks and cancels the shadow tasks of one forwarder."""

    def __init__(
        self,
        *,
        upstreams: Upstreams,
        new_id: RequestIds,
        finish: Callable[[Trace], None],
        skipped: Callable[[], None],
        cap: int,
        inject_usage: bool,
    ) -> None:
        self._upstreams = upstreams
        self._new_id = new_id
        self._finish = finish
        self._skipped = skipped
        self._cap = cap
        self._inject_usage = inject_usage
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False

    @property
    def active(self) -> int:
        return len(self._tasks)

    async def close(self) -> None:
        """Cancel shadows still running; each still writes its record."""
        self._closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    def start(
        self,
        arm: Arm,
        path: str,
        endpoint: str,
        doc: dict[str, Any],
        body: bytes,
        injected: bool,
        injected_body: bytes,
        headers: OutboundHeaders,
        model: str,
        stream: bool,
        pair_id: str,
    ) -> None:
        if self._closing or len(self._tasks) >= self._cap or self._upstreams.down(arm):
            self._skipped()
            return
        if injected:
            shadow_body = injected_body
        elif stream and self._inject_usage and should_inject(doc):
            shadow_body = with_usage(doc, body)
        else:
            shadow_body = body
        trace = Trace(
            request_id=self._new_id(),
            arm=arm,
            endpoint=endpoint,
            model=model,
            stream=stream,
            pair_id=pair_id,
            shadow=True,
            received=time.perf_counter(),
            t_start=time.time(),
        )
        trace.temperature = temperature_of(doc)
        task = asyncio.create_task(self._run(trace, path, shadow_body, headers))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, trace: Trace, path: str, body: bytes, headers: OutboundHeaders) -> None:
        """Send the mirrored request, read the answer fully with timestamps, return nothing."""
        perf_counter = time.perf_counter
        upstream: Reply | None = None
        try:
            trace.upstream_start = perf_counter()
            upstream = await self._upstreams.send(
                trace, Mode.measured(trace.stream), path, body, headers
            )
            if is_event_stream(upstream.content_type):
                scanner = trace.scanner = SSEScanner()
                while chunk := await upstream.readany():
                    now = trace.upstream_end = perf_counter()
                    scanner.feed(chunk, now)
                    if scanner.oversized:
                        break  # `defect` says event_too_large; the connection is closed
                scanner.finish()
                defect = scanner.defect() if upstream.status == 200 else None
                if defect is not None:
                    trace.fail(defect)
            else:
                payload = await upstream.read()
                trace.upstream_end = perf_counter()
                if upstream.status == 200:
                    trace.non_stream_usage, trace.speculative = usage_of(payload)
            trace.e2e_end = trace.upstream_end
        except UpstreamError as exc:  # before the headers `send` noted it in the trace already
            trace.fail(exc.kind)
        except asyncio.CancelledError:
            trace.fail(ErrorKind.CANCELLED, STATUS_CLIENT_GONE)
            raise
        finally:
            self._upstreams.end(trace, upstream)
            self._finish(trace)
