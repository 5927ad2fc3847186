"""What the proxy learns about one arm call while it runs, and the one record it becomes.

A `Trace` is mutable and private to the call (primary or shadow); `to_record` turns it into the
immutable `RequestRecord` once, at the end, whatever happened.
"""

from __future__ import annotations

import itertools
import os
import time
from typing import Any, Final

from specproxy.proxy.sse import SSEScanner
from specproxy.records import Arm, RequestRecord

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
        "disconnected",
        "e2e_end",
        "endpoint",
        "error_kind",
        "model",
        "non_stream_usage",
        "pair_id",
        "received",
        "request_id",
        "scanner",
        "shadow",
        "speculative",
        "status",
        "stream",
        "t_start",
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
        self.error_kind: str | None = None
        self.disconnected = False
        self.scanner: SSEScanner | None = None
        self.non_stream_usage: dict[str, Any] | None = None
        self.speculative: dict[str, Any] | None = None

    def fail(self, kind: str, status: int | None = None) -> None:
        if self.error_kind is None:
            self.error_kind = kind
        if status is not None and not self.status:
            self.status = status

    def to_record(self, run_id: str) -> RequestRecord:
        now = time.perf_counter()
        end = self.e2e_end if self.e2e_end is not None else now
        upstream_end = self.upstream_end if self.upstream_end is not None else end
        e2e = end - self.received
        scanner = self.scanner
        usage = self.non_stream_usage
        speculative = self.speculative
        ttft = mean_gap = max_gap = tokens_per_event = None
        n_events = 0
        token_ids_total: int | None = None
        if scanner is not None:
            usage = scanner.usage
            speculative = scanner.speculative
            n_events = scanner.n_events
            if scanner.first_content_at is not None:
                ttft = scanner.first_content_at - self.received
            if scanner.gaps:
                mean_gap = sum(scanner.gaps) / len(scanner.gaps)
                max_gap = max(scanner.gaps)
            if scanner.token_ids_complete and n_events:
                token_ids_total = scanner.token_ids
        prompt_tokens = output_tokens = None
        if usage is not None:
            prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            output_tokens = _int_or_none(usage.get("completion_tokens"))
        if output_tokens is None:
            output_tokens = token_ids_total
        tpot = None
        complete = self.error_kind is None
        if complete and ttft is not None and output_tokens is not None and output_tokens > 1:
            tpot = (e2e - ttft) / (output_tokens - 1)
        if output_tokens is not None and n_events:
            tokens_per_event = output_tokens / n_events
        acceptance_rate = acceptance_length = None
        if speculative is not None:
            acceptance_rate = _float_or_none(speculative.get("draft_acceptance_rate"))
            acceptance_length = _float_or_none(speculative.get("mean_acceptance_length"))
        return RequestRecord(
            request_id=self.request_id,
            run_id=run_id,
            arm=self.arm,
            t_start=self.t_start,
            model=self.model,
            endpoint=self.endpoint,
            stream=self.stream,
            status=self.status,
            e2e_s=e2e,
            upstream_s=upstream_end - self.upstream_start,
            ttft_s=ttft,
            tpot_s=tpot,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            n_events=n_events,
            tokens_per_event=tokens_per_event,
            mean_gap_s=mean_gap,
            max_gap_s=max_gap,
            acceptance_rate=acceptance_rate,
            mean_acceptance_length=acceptance_length,
            pair_id=self.pair_id,
            shadow=self.shadow,
            error_kind=self.error_kind,
            disconnected=self.disconnected,
        )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
