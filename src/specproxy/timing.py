"""Raw per-request timestamps and counts, and the one derivation of a record's measurements.

Whoever times a request (the proxy for every arm call, the load generator for every request it
sends) fills one `RequestTimings` as things happen, and `derive` turns it into the measured half
of a `RequestRecord` (guidellm's `schemas/info.py` model: raw events stored once, every metric
derived once). So TTFT, TPOT, gaps, tokens per event and acceptance mean the same thing wherever
a record comes from, and bench rows and proxy rows can share a store and its statistics.

    request_start ── upstream_start ── first content event ── ... ── upstream_end ── request_end
         │                                   │ gaps between content events │
         └──────────── ttft_s ───────────────┘                             │
         └──────────────────────────────── e2e_s ──────────────────────────┴──────────┘

The events of a streamed response are counted by `specproxy.proxy.sse.SSEScanner` (any object
with the `ContentEvents` attributes will do): when the first content event arrived, how many
there were, the gaps between them, their `token_ids`, and the final usage chunk. A content event
is one that carries generated text, reasoning text, tool calls or token ids.

To add a per-request measurement: the field to `records.RequestRecord` and to `Measures`, its
formula to `derive` and its hand-over to `Measures.record`, and its column to the store
(`store.schema`: both dialects' DDL, a migration, `REQUEST_COLUMNS` and the row). Only a new raw
fact also needs a field in `RequestTimings` (or `ContentEvents`, the scanner) and the one line
that stamps it, in the proxy (`proxy.trace`) and in the load generator (`loadgen`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from specproxy.errors import ErrorKind
from specproxy.fastinit import fast_init
from specproxy.records import Arm, RequestRecord, RerouteReason

__all__ = ["ContentEvents", "Measures", "RequestTimings", "derive"]


class ContentEvents(Protocol):
    """What an SSE scanner counted of one streamed response (times on the request's clock)."""

    @property
    def first_content_at(self) -> float | None: ...
    @property
    def n_events(self) -> int: ...  # events with content
    @property
    def gaps(self) -> Sequence[float]: ...  # between consecutive content events
    @property
    def token_ids(self) -> int: ...  # sum of the `token_ids` lists of the content events
    @property
    def token_ids_complete(self) -> bool: ...  # every content event carried `token_ids`
    @property
    def usage(self) -> Mapping[str, Any] | None: ...  # the final usage chunk's `usage`
    @property
    def speculative(self) -> Mapping[str, Any] | None: ...  # its `metrics.speculative_decoding`


@dataclass(slots=True)
class RequestTimings:
    """What was seen of one request, as it happened; filled in while the request runs.

    Times are seconds of one monotonic clock (`time.perf_counter`). `request_start` is when the
    proxy received the request, or just before the load generator sent it; `upstream_start` is
    when the request went upstream (the same instant for the load generator). `request_end` is
    the last byte written to the client (proxy) or read from the server (load generator).
    """

    request_start: float
    upstream_start: float
    upstream_end: float | None = None  # last upstream byte
    request_end: float | None = None
    status: int = 0  # the status the client got (0 until known)
    error_kind: ErrorKind | None = None  # the first failure; None while all goes well
    disconnected: bool = False  # the client went away before the response finished
    events: ContentEvents | None = None  # a streamed (text/event-stream) response
    usage: Mapping[str, Any] | None = None  # a non-streaming body's `usage`
    speculative: Mapping[str, Any] | None = None  # its `metrics.speculative_decoding`

    def fail(self, kind: ErrorKind, status: int | None = None) -> None:
        """Note a failure; the first one wins, and `status` only fills a status not yet known."""
        if self.error_kind is None:
            self.error_kind = kind
        if status is not None and not self.status:
            self.status = status


@fast_init  # built once per request on the event loop (see `specproxy.fastinit`)
@dataclass(frozen=True, slots=True)
class Measures:
    """The measured fields of a `RequestRecord`, as `derive` computes them (see its fields)."""

    status: int
    e2e_s: float
    upstream_s: float
    ttft_s: float | None = None
    tpot_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    n_events: int = 0
    tokens_per_event: float | None = None
    mean_gap_s: float | None = None
    max_gap_s: float | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    error_kind: ErrorKind | None = None
    disconnected: bool = False

    def record(
        self,
        *,
        request_id: str,
        run_id: str,
        arm: Arm,
        t_start: float,
        model: str,
        endpoint: str,
        stream: bool,
        pair_id: str | None = None,
        shadow: bool = False,
        engine_url: str | None = None,
        rerouted_from: Arm | None = None,
        reroute_reason: RerouteReason | None = None,
        arm_in_flight: int | None = None,
        endpoint_in_flight: int | None = None,
        engine_running: float | None = None,
        engine_waiting: float | None = None,
        temperature: float | None = None,
        category: str | None = None,
    ) -> RequestRecord:
        """The store row: these measurements plus who and what the request was, and the
        conditions it met."""
        # Positional, in `RequestRecord`'s field order: a 34-keyword call costs more than the
        # record itself (test_timing holds the order against the keyword form).
        return RequestRecord(
            request_id,
            run_id,
            arm,
            t_start,
            model,
            endpoint,
            stream,
            self.status,
            self.e2e_s,
            self.upstream_s,
            self.ttft_s,
            self.tpot_s,
            self.prompt_tokens,
            self.output_tokens,
            self.n_events,
            self.tokens_per_event,
            self.mean_gap_s,
            self.max_gap_s,
            self.acceptance_rate,
            self.mean_acceptance_length,
            pair_id,
            shadow,
            self.error_kind,
            self.disconnected,
            engine_url,
            rerouted_from,
            reroute_reason,
            arm_in_flight,
            endpoint_in_flight,
            engine_running,
            engine_waiting,
            temperature,
            category,
        )


def derive(t: RequestTimings, now: float | None = None) -> Measures:
    """Every per-request measurement, from the raw timings alone (pure but for the default `now`).

    - `e2e_s` = request_end - request_start; a request that never ended (cancelled, a bug) ends
      at `now`. `upstream_s` = upstream_end - upstream_start (the upstream end defaults to the
      request's end).
    - `ttft_s` = first content event - request_start (streams only).
    - `output_tokens` = usage.completion_tokens, else the sum of the events' `token_ids` when every
      content event carried them; `prompt_tokens` = usage.prompt_tokens.
    - `tpot_s` = (e2e - ttft) / (output_tokens - 1), for complete requests with > 1 token only
      (a broken or cut-off request's decode time is not a decode time).
    - `tokens_per_event` = output_tokens / content events; `mean_gap_s`/`max_gap_s` over the gaps
      between content events.
    - acceptance: `metrics.speculative_decoding.{draft_acceptance_rate, mean_acceptance_length}`;
      both None when it says no draft token was proposed (`num_draft_tokens` 0: vLLM then reports
      rate 0.0 and length 1.0, which would read as "every draft rejected").
    """
    if now is None:
        now = time.perf_counter()
    end = t.request_end if t.request_end is not None else now
    upstream_end = t.upstream_end if t.upstream_end is not None else end
    e2e = end - t.request_start
    usage = t.usage
    speculative = t.speculative
    ttft = mean_gap = max_gap = tokens_per_event = None
    n_events = 0
    token_ids_total: int | None = None
    events = t.events
    if events is not None:
        usage = events.usage
        speculative = events.speculative
        n_events = events.n_events
        if events.first_content_at is not None:
            ttft = events.first_content_at - t.request_start
        gaps = events.gaps
        if gaps:
            mean_gap = sum(gaps) / len(gaps)
            max_gap = max(gaps)
        if events.token_ids_complete and n_events:
            token_ids_total = events.token_ids
    prompt_tokens = output_tokens = None
    if usage is not None:
        prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
        output_tokens = _int_or_none(usage.get("completion_tokens"))
    if output_tokens is None:
        output_tokens = token_ids_total
    tpot = None
    complete = t.error_kind is None
    if complete and ttft is not None and output_tokens is not None and output_tokens > 1:
        tpot = (e2e - ttft) / (output_tokens - 1)
    if output_tokens is not None and n_events:
        tokens_per_event = output_tokens / n_events
    acceptance_rate = acceptance_length = None
    if speculative is not None and speculative.get("num_draft_tokens") != 0:
        acceptance_rate = _float_or_none(speculative.get("draft_acceptance_rate"))
        acceptance_length = _float_or_none(speculative.get("mean_acceptance_length"))
    return Measures(  # positional, in field order (see `Measures.record`)
        t.status,
        e2e,
        upstream_end - t.upstream_start,
        ttft,
        tpot,
        prompt_tokens,
        output_tokens,
        n_events,
        tokens_per_event,
        mean_gap,
        max_gap,
        acceptance_rate,
        acceptance_length,
        t.error_kind,
        t.disconnected,
    )


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
