"""What the proxy learns about one arm call while it runs, and the one record it becomes.

A `Trace` is mutable and private to the call (primary or shadow); `to_record` turns it into the
immutable `RequestRecord` once, at the end, whatever happened, through `specproxy.timing.derive`
(the load generator uses the same derivation). A primary call to a treatment that was down and
served by the control instead is `reroute`d: its arm becomes the control (so the response's
`x-specproxy-arm` names who answered), and it is no member of a mirrored pair any more.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Final

from specproxy.errors import ErrorKind
from specproxy.fleet.pool import Endpoint
from specproxy.proxy.sse import SSEScanner
from specproxy.records import Arm, RequestRecord, RerouteReason
from specproxy.timing import RequestTimings, derive

__all__ = ["STATUS_CLIENT_GONE", "RequestIds", "Trace"]

STATUS_CLIENT_GONE: Final = 499  # nginx's "client closed request"


class RequestIds:
    """Request ids unique across processes and restarts: a random prefix and a counter."""

    __slots__ = ("_counter", "_prefix")

    def __init__(self) -> None:
        self._prefix = os.urandom(5).hex()
        self._counter = itertools.count()

    def __call__(self) -> str:
        return f"{self._prefix}{next(self._counter):07x}"


class Trace:
    """Mutable facts about one arm call, turned into one immutable record at the end."""

    __slots__ = (
        "arm",
        "arm_in_flight",
        "category",
        "disconnected",
        "e2e_end",
        "endpoint",
        "endpoint_in_flight",
        "engine",
        "engine_running",
        "engine_url",
        "engine_waiting",
        "error_kind",
        "model",
        "non_stream_usage",
        "pair_id",
        "received",
        "request_id",
        "reroute_reason",
        "rerouted_from",
        "scanner",
        "shadow",
        "speculative",
        "status",
        "stream",
        "t_start",
        "temperature",
        "upstream_end",
        "upstream_start",
    )

    def __init__(
        self,
        *,
        request_id: str,
        arm: Arm,
        endpoint: str,
        model: str,
        stream: bool,
        pair_id: str | None,
        shadow: bool,
        received: float,
        t_start: float,
    ) -> None:
        self.request_id = request_id
        self.arm = arm
        self.endpoint = endpoint
        self.model = model
        self.stream = stream
        self.pair_id = pair_id
        self.shadow = shadow
        self.received = received
        self.t_start = t_start
        self.upstream_start = received
        self.upstream_end: float | None = None
        self.e2e_end: float | None = None
        self.status = 0
        self.error_kind: ErrorKind | None = None
        self.disconnected = False
        self.scanner: SSEScanner | None = None
        self.non_stream_usage: dict[str, Any] | None = None
        self.speculative: dict[str, Any] | None = None
        self.engine_url: str | None = None  # the arm's endpoint the call went to
        self.engine: Endpoint | None = None  # that endpoint, until its outcome is reported
        self.rerouted_from: Arm | None = None  # the treatment it was routed to, when rerouted
        self.reroute_reason: RerouteReason | None = None
        # The request's conditions (`RequestRecord.arm_in_flight` ...): the proxy's calls in
        # flight and the engine's load when it was sent (`Upstreams.send`), and what the client
        # stated (`proxy.conditions`).
        self.arm_in_flight: int | None = None
        self.endpoint_in_flight: int | None = None
        self.engine_running: float | None = None
        self.engine_waiting: float | None = None
        self.temperature: float | None = None
        self.category: str | None = None

    def reroute(self, reason: RerouteReason, control: Arm) -> None:
        """The arm this call was routed to is down: the control serves it instead. The pair it
        was part of is left (its shadow went to the control too: it cannot pair with itself)."""
        self.rerouted_from = self.arm
        self.reroute_reason = reason
        self.arm = control
        self.pair_id = None

    def fail(self, kind: ErrorKind, status: int | None = None) -> None:
        if self.error_kind is None:
            self.error_kind = kind
        if status is not None and not self.status:
            self.status = status

    def to_record(self, run_id: str, now: float | None = None) -> RequestRecord:
        """The record; `now` (default: the clock) ends a call that never saw its last byte."""
        timings = RequestTimings(
            request_start=self.received,
            upstream_start=self.upstream_start,
            upstream_end=self.upstream_end,
            request_end=self.e2e_end,
            status=self.status,
            error_kind=self.error_kind,
            disconnected=self.disconnected,
            events=self.scanner,
            usage=self.non_stream_usage,
            speculative=self.speculative,
        )
        return derive(timings, time.perf_counter() if now is None else now).record(
            request_id=self.request_id,
            run_id=run_id,
            arm=self.arm,
            t_start=self.t_start,
            model=self.model,
            endpoint=self.endpoint,
            stream=self.stream,
            pair_id=self.pair_id,
            shadow=self.shadow,
            engine_url=self.engine_url,
            rerouted_from=self.rerouted_from,
            reroute_reason=self.reroute_reason,
            arm_in_flight=self.arm_in_flight,
            endpoint_in_flight=self.endpoint_in_flight,
            engine_running=self.engine_running,
            engine_waiting=self.engine_waiting,
            temperature=self.temperature,
            category=self.category,
        )
