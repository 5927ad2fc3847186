"""The request lifecycle: pick an arm, forward, stream the answer back, time it, record it.

Upstream bytes reach the client as they arrive and unmodified (the one exception: the usage
event the proxy itself asked for is removed, see `sse`). Timing is taken on the side:
request received -> upstream headers -> first content event -> every event -> last byte
written. Every call to an arm, primary or shadow, ends in exactly one `RequestRecord`, whatever
happens (success, upstream error, client disconnect, shutdown): the record is built in a
`finally` block.

Failure mapping: refused/unreachable -> 502, connect or read timeout before the headers -> 504
(OpenAI-style JSON); upstream 4xx/5xx pass through; a stream that breaks mid-way is cut off the
same way for the client (no synthetic end); a client that goes away closes the upstream
connection, which makes vLLM abort the generation.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Protocol

from aiohttp import ClientError, ClientResponse, ClientSession, web
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from specproxy.config import Config
from specproxy.errors import error_body
from specproxy.metrics import ProxyMetrics, fast_increment, fast_observe
from specproxy.proxy.routing import FORCED_ARM_HEADER, ForcedArmError, Router
from specproxy.proxy.sse import SSEScanner
from specproxy.proxy.upstream import UpstreamError, UpstreamPool
from specproxy.records import Arm, Recorder, RequestRecord

__all__ = [
    "ARM_HEADER",
    "MEASURED_ENDPOINTS",
    "REQUEST_ID_HEADER",
    "Forwarder",
]

log = logging.getLogger(__name__)
_DECODER = json.JSONDecoder()

ARM_HEADER: Final = "x-specproxy-arm"
REQUEST_ID_HEADER: Final = "x-specproxy-request-id"
# URL path -> the `endpoint` value of the record.
MEASURED_ENDPOINTS: Final = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat.completions",
}
_HOP_BY_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# Request headers the proxy never forwards: hop-by-hop ones, those aiohttp recomputes, its own.
_DROP_REQUEST: Final = _HOP_BY_HOP | {"host", "content-length", "expect", FORCED_ARM_HEADER}
_DROP_REQUEST_BYTES: Final = frozenset(name.encode() for name in _DROP_REQUEST)
# Response headers the proxy never forwards: hop-by-hop ones, the length (aiohttp sets it), and
# its own, which it sets (an upstream that sends them, e.g. another specproxy, is overridden).
_DROP_RESPONSE: Final = _HOP_BY_HOP | {"content-length", ARM_HEADER, REQUEST_ID_HEADER}
_STATUS_CLIENT_GONE: Final = 499  # nginx's "client closed request"
_BUFFER_LIMIT: Final = 8 * 1024 * 1024  # non-stream bodies up to this size are sent in one write


class _Body(Protocol):
    async def readany(self) -> bytes: ...


class _Reply(Protocol):
    """What the request path reads from an upstream response: aiohttp's or the lean client's."""

    @property
    def status(self) -> int: ...
    @property
    def reason(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def content_length(self) -> int | None: ...
    @property
    def content(self) -> _Body: ...
    async def read(self) -> bytes: ...
    def release(self) -> Any: ...
    def close(self) -> None: ...


# Failures of an upstream call, from either client.
_UPSTREAM_ERRORS: Final = (ClientError, UpstreamError, TimeoutError)


class _Failure(Exception):
    """An upstream failure before any byte reached the client."""

    def __init__(self, kind: str, status: int, error_type: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.error_type = error_type


class _Trace:
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


class Forwarder:
    """Serves the proxied routes for one app; owns the routing RNG and the shadow tasks."""

    def __init__(
        self,
        cfg: Config,
        *,
        sessions: Mapping[Arm, ClientSession],
        recorder: Recorder,
        metrics: ProxyMetrics,
    ) -> None:
        self._cfg = cfg
        self._run_id = cfg.run_id
        self._sessions = dict(sessions)
        self._recorder = recorder
        self._metrics = metrics
        self._router = Router(cfg.routing)
        self._mirror_enabled = cfg.routing.mirror_fraction > 0
        self._shadow_cap = cfg.routing.max_concurrent_shadows
        self._shadows: set[asyncio.Task[None]] = set()
        self._inject_usage = cfg.inject_usage
        self._max_body = cfg.max_body_bytes
        self._urls = {
            arm: {
                path: URL(cfg.upstream_url(arm) + path, encoded=True) for path in MEASURED_ENDPOINTS
            }
            for arm in Arm
        }
        # Non-streaming calls to plain-http arms go through the lean client (see `upstream`).
        self._pools: dict[Arm, UpstreamPool] = {}
        self._pool_paths: dict[Arm, dict[str, str]] = {}
        for arm in Arm:
            base = URL(cfg.upstream_url(arm))
            if base.scheme == "http" and base.host is not None and not base.query_string:
                self._pools[arm] = UpstreamPool(
                    base.host,
                    base.port or 80,
                    connect_timeout=cfg.timeouts.connect_s,
                    read_timeout=cfg.timeouts.read_s,
                )
                prefix = base.raw_path.rstrip("/")
                self._pool_paths[arm] = {path: prefix + path for path in MEASURED_ENDPOINTS}
        self._id_prefix = os.urandom(5).hex()
        self._id_counter = itertools.count()
        # Labelled children cached per label set: .labels() takes a lock and builds a tuple.
        self._children: dict[tuple[Arm, str, bool], tuple[Callable[[float], None], ...]] = {}
        self._request_counters: dict[tuple[Arm, int], Callable[[], None]] = {}
        # In-flight counts are plain ints read at scrape time (no lock on the request path).
        self._inflight = dict.fromkeys(Arm, 0)
        for arm in Arm:
            metrics.inflight.labels(arm.value).set_function(
                functools.partial(self._inflight_of, arm)
            )
        self._closing = False

    # ----------------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Cancel shadows still running; each still writes its record."""
        self._closing = True
        tasks = list(self._shadows)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        for pool in self._pools.values():
            await pool.close()

    def _inflight_of(self, arm: Arm) -> float:
        return float(self._inflight[arm])

    @property
    def active_shadows(self) -> int:
        return len(self._shadows)

    # ----------------------------------------------------------------------- handlers

    async def measured(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions and /v1/chat/completions: routed, timed and recorded."""
        received = time.perf_counter()
        t_start = time.time()
        request_id = f"{self._id_prefix}{next(self._id_counter):07x}"
        endpoint = MEASURED_ENDPOINTS[request.path]
        length = request.content_length
        if length is not None and length > self._max_body:
            return _too_large(request_id, self._max_body)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(request_id, self._max_body)
        try:
            doc = json.loads(body)
        except ValueError as exc:
            return _bad_request(request_id, f"request body is not valid JSON: {exc}")
        if not isinstance(doc, dict):
            return _bad_request(request_id, "request body must be a JSON object")
        try:
            arm = self._router.choose(request.headers, doc.get("user"))
        except ForcedArmError as exc:
            return _bad_request(request_id, str(exc), param=FORCED_ARM_HEADER)
        model = doc.get("model")
        model = model if isinstance(model, str) else ""
        stream = doc.get("stream") is True
        strip_usage = stream and self._inject_usage and _should_inject(doc)
        upstream_body = _with_usage(doc) if strip_usage else body
        pair_id = None
        if self._mirror_enabled and self._router.mirror():
            pair_id = request_id
            self._start_shadow(
                arm.other,
                endpoint,
                doc,
                body,
                strip_usage,
                upstream_body,
                _request_headers(request.headers),
                model,
                stream,
                pair_id,
            )
        trace = _Trace(
            request_id=request_id,
            arm=arm,
            endpoint=endpoint,
            model=model,
            stream=stream,
            pair_id=pair_id,
            shadow=False,
            received=received,
            t_start=t_start,
        )
        return await self._primary(request, trace, upstream_body, strip_usage)

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        """Any other /v1/* request: forwarded to the baseline arm, streamed, not measured."""
        request_id = f"{self._id_prefix}{next(self._id_counter):07x}"
        arm = Arm.BASELINE
        raw = request.raw_path
        if not _safe_path(raw):
            return _json_error(
                400, "BadRequestError", f"refusing to proxy path {raw!r}", request_id
            )
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return _too_large(request_id, self._max_body)
        url = URL(self._cfg.upstream_url(arm) + raw, encoded=True)
        session = self._sessions[arm]
        try:
            upstream = await session.request(
                request.method,
                url,
                data=body or None,
                headers=_request_headers(request.headers),
                allow_redirects=False,
            )
        except (ClientError, TimeoutError) as exc:
            failure = _classify(exc, arm)
            return _json_error(failure.status, failure.error_type, str(failure), request_id, arm)
        resp = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=_response_headers(upstream.headers, arm, request_id),
        )
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        complete = False
        try:
            await resp.prepare(request)
            while chunk := await upstream.content.readany():
                await resp.write(chunk)
            await resp.write_eof()
            complete = True
        except (ClientError, TimeoutError):
            _cut_off(request)
        except ConnectionError:
            pass  # the client went away
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()
        return resp

    # ----------------------------------------------------------------------- primary path

    async def _primary(
        self,
        request: web.Request,
        trace: _Trace,
        body: bytes,
        strip_usage: bool,
    ) -> web.StreamResponse:
        arm = trace.arm
        self._inflight[arm] += 1
        upstream: _Reply | None = None
        try:
            trace.upstream_start = time.perf_counter()
            pool = None if trace.stream else self._pools.get(arm)
            try:
                if pool is not None:
                    upstream = await pool.post(
                        self._pool_paths[arm][request.path], body, _raw_request_headers(request)
                    )
                else:
                    upstream = await self._sessions[arm].post(
                        self._urls[arm][request.path],
                        data=body,
                        headers=_request_headers(request.headers),
                        allow_redirects=False,
                    )
            except _UPSTREAM_ERRORS as exc:
                failure = _classify(exc, arm)
                trace.fail(failure.kind, failure.status)
                return await self._send_error(request, trace, failure)
            trace.status = upstream.status
            if upstream.status >= 400:
                trace.fail("http_4xx" if upstream.status < 500 else "http_5xx")
            if _is_event_stream(upstream):
                return await self._stream(request, trace, upstream, strip_usage)
            return await self._buffered(request, trace, upstream)
        except asyncio.CancelledError:
            trace.disconnected = True
            trace.fail("disconnected", _STATUS_CLIENT_GONE)
            raise
        finally:
            if upstream is not None:
                if trace.error_kind is None:
                    upstream.release()
                else:
                    upstream.close()
            self._inflight[arm] -= 1
            self._finish(trace)

    async def _stream(
        self, request: web.Request, trace: _Trace, upstream: _Reply, strip_usage: bool
    ) -> web.StreamResponse:
        resp = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=_response_headers(upstream.headers, trace.arm, trace.request_id),
        )
        scanner = trace.scanner = SSEScanner(strip_usage=strip_usage)
        perf_counter = time.perf_counter
        content = upstream.content
        try:
            await resp.prepare(request)
        except ConnectionError:
            trace.disconnected = True
            trace.fail("disconnected", _STATUS_CLIENT_GONE)
            return resp
        while True:
            try:
                chunk = await content.readany()
            except _UPSTREAM_ERRORS as exc:
                trace.upstream_end = perf_counter()
                trace.fail("timeout" if isinstance(exc, TimeoutError) else "broken")
                await self._flush(resp, scanner.finish())
                _cut_off(request)
                trace.e2e_end = perf_counter()
                return resp
            now = perf_counter()
            if not chunk:
                break
            trace.upstream_end = now
            out = scanner.feed(chunk, now)
            if out and not await self._flush(resp, out):
                trace.disconnected = True
                trace.fail("disconnected")
                trace.e2e_end = perf_counter()
                return resp
        tail = scanner.finish()
        if (tail and not await self._flush(resp, tail)) or not await _write_eof(resp):
            trace.disconnected = True
            trace.fail("disconnected")
        trace.e2e_end = perf_counter()
        return resp

    async def _buffered(
        self, request: web.Request, trace: _Trace, upstream: _Reply
    ) -> web.StreamResponse:
        length = upstream.content_length
        if length is None or length > _BUFFER_LIMIT:
            return await self._stream(request, trace, upstream, strip_usage=False)
        try:
            payload = await upstream.read()
        except _UPSTREAM_ERRORS as exc:
            failure = _classify(exc, trace.arm)
            kind = "timeout" if failure.kind == "timeout" else "broken"
            trace.fail(kind)
            trace.status = failure.status  # what the client gets: nothing was sent yet
            return await self._send_error(request, trace, failure)
        trace.upstream_end = time.perf_counter()
        if upstream.status == 200:
            trace.non_stream_usage, trace.speculative = _usage_of(payload)
        resp = web.Response(
            body=payload,
            status=upstream.status,
            reason=upstream.reason,
            headers=_response_headers(upstream.headers, trace.arm, trace.request_id),
        )
        try:  # `_write_eof` inlined: one coroutine frame less on the hot path
            await resp.prepare(request)
            await resp.write_eof()
        except ConnectionError:
            trace.disconnected = True
            trace.fail("disconnected")
        trace.e2e_end = time.perf_counter()
        return resp

    async def _send_error(
        self, request: web.Request, trace: _Trace, failure: _Failure
    ) -> web.StreamResponse:
        resp = _json_error(
            failure.status, failure.error_type, str(failure), trace.request_id, trace.arm
        )
        if not await _write_eof(resp, request):
            trace.disconnected = True
        trace.e2e_end = time.perf_counter()
        return resp

    @staticmethod
    async def _flush(resp: web.StreamResponse, data: bytes) -> bool:
        if not data:
            return True
        try:
            await resp.write(data)
        except ConnectionError:
            return False
        return True

    # ----------------------------------------------------------------------- shadows

    def _start_shadow(
        self,
        arm: Arm,
        endpoint: str,
        doc: dict[str, Any],
        body: bytes,
        injected: bool,
        injected_body: bytes,
        headers: CIMultiDict[str],
        model: str,
        stream: bool,
        pair_id: str,
    ) -> None:
        if self._closing or len(self._shadows) >= self._shadow_cap:
            self._metrics.shadow_skipped.inc()
            return
        if injected:
            shadow_body = injected_body
        elif stream and self._inject_usage and _should_inject(doc):
            shadow_body = _with_usage(doc)
        else:
            shadow_body = body
        path = next(p for p, name in MEASURED_ENDPOINTS.items() if name == endpoint)
        trace = _Trace(
            request_id=f"{self._id_prefix}{next(self._id_counter):07x}",
            arm=arm,
            endpoint=endpoint,
            model=model,
            stream=stream,
            pair_id=pair_id,
            shadow=True,
            received=time.perf_counter(),
            t_start=time.time(),
        )
        task = asyncio.create_task(self._shadow(trace, self._urls[arm][path], shadow_body, headers))
        self._shadows.add(task)
        task.add_done_callback(self._shadows.discard)

    async def _shadow(
        self, trace: _Trace, url: URL, body: bytes, headers: CIMultiDict[str]
    ) -> None:
        """Send the mirrored request, read the answer fully with timestamps, return nothing."""
        perf_counter = time.perf_counter
        upstream: ClientResponse | None = None
        try:
            trace.upstream_start = perf_counter()
            upstream = await self._sessions[trace.arm].post(
                url, data=body, headers=headers, allow_redirects=False
            )
            trace.status = upstream.status
            if upstream.status >= 400:
                trace.fail("http_4xx" if upstream.status < 500 else "http_5xx")
            if _is_event_stream(upstream):
                scanner = trace.scanner = SSEScanner()
                while chunk := await upstream.content.readany():
                    now = trace.upstream_end = perf_counter()
                    scanner.feed(chunk, now)
            else:
                payload = await upstream.read()
                trace.upstream_end = perf_counter()
                if upstream.status == 200:
                    trace.non_stream_usage, trace.speculative = _usage_of(payload)
            trace.e2e_end = trace.upstream_end
        except (ClientError, TimeoutError) as exc:
            failure = _classify(exc, trace.arm)
            if upstream is not None:
                trace.fail("timeout" if failure.kind == "timeout" else "broken")
            else:
                trace.fail(failure.kind, failure.status)
        except asyncio.CancelledError:
            trace.fail("cancelled", _STATUS_CLIENT_GONE)
            raise
        finally:
            if upstream is not None:
                upstream.close()
            self._finish(trace)

    # ----------------------------------------------------------------------- recording

    def _finish(self, trace: _Trace) -> None:
        """Hand the record to the recorder and the Prometheus collectors; never raises."""
        try:
            rec = trace.to_record(self._run_id)
        except Exception:  # a bug here must not lose the response; log it loudly
            log.exception("could not build the record of request %s", trace.request_id)
            return
        self._recorder.record(rec)
        if not rec.shadow:
            self._observe(rec, trace.scanner.gaps if trace.scanner is not None else ())
        elif rec.error_kind is not None and rec.error_kind != "cancelled":
            self._metrics.upstream_errors.labels(rec.arm.value, rec.error_kind).inc()

    def _observe(self, rec: RequestRecord, gaps: Sequence[float]) -> None:
        arm = rec.arm
        count = self._request_counters.get((arm, rec.status))
        if count is None:
            count = self._request_counters[(arm, rec.status)] = fast_increment(
                self._metrics.requests.labels(arm.value, str(rec.status))
            )
        count()
        kind = rec.error_kind
        if kind is not None:
            if kind != "disconnected":
                self._metrics.upstream_errors.labels(arm.value, kind).inc()
            return
        key = (arm, rec.endpoint, rec.stream)
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = self._observers(key)
        duration, ttft, tpot, gap, per_event, out, overhead, acceptance = children
        e2e = rec.e2e_s
        duration(e2e)
        overhead(e2e - rec.upstream_s if e2e > rec.upstream_s else 0.0)
        if rec.ttft_s is not None:
            ttft(rec.ttft_s)
        if rec.tpot_s is not None:
            tpot(rec.tpot_s)
        if rec.tokens_per_event is not None:
            per_event(rec.tokens_per_event)
        if rec.output_tokens is not None:
            out(rec.output_tokens)
        if rec.mean_acceptance_length is not None:
            acceptance(rec.mean_acceptance_length)
        for value in gaps:
            gap(value)

    def _observers(self, key: tuple[Arm, str, bool]) -> tuple[Callable[[float], None], ...]:
        """The histogram children of one (arm, endpoint, stream), as fast observe callables."""
        m = self._metrics
        arm, endpoint, stream = key[0].value, key[1], key[2]
        return tuple(
            fast_observe(child)
            for child in (
                m.request_duration.labels(arm, endpoint, "true" if stream else "false"),
                m.ttft.labels(arm, endpoint),
                m.tpot.labels(arm, endpoint),
                m.event_gap.labels(arm),
                m.tokens_per_event.labels(arm),
                m.output_tokens.labels(arm),
                m.proxy_overhead.labels(arm),
                m.request_acceptance_length.labels(arm),
            )
        )


# --------------------------------------------------------------------------- helpers


def _should_inject(doc: Mapping[str, Any]) -> bool:
    """Ask upstream for usage on the client's behalf? Only when it changes nothing else."""
    options = doc.get("stream_options")
    if options is not None:
        if not isinstance(options, dict) or options.get("include_usage") is True:
            return False
        if options.get("continuous_usage_stats"):
            return False  # usage would then appear in every chunk
    return doc.get("n") in (None, 1)


def _with_usage(doc: Mapping[str, Any]) -> bytes:
    changed = dict(doc)
    options = dict(doc.get("stream_options") or {})
    options["include_usage"] = True
    changed["stream_options"] = options
    return json.dumps(changed, ensure_ascii=False, separators=(",", ":")).encode()


def _usage_of(payload: bytes) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """`usage` and `metrics.speculative_decoding` of a non-streaming body, if present.

    Only those two small objects are decoded (the body can be large); a key that is not
    followed by an object falls back to parsing the whole body.
    """
    usage = _object_after(payload, b'"usage"')
    speculative = _object_after(payload, b'"speculative_decoding"')
    if usage is _NOT_FOUND and speculative is _NOT_FOUND:
        return None, None
    if usage is _UNSURE or speculative is _UNSURE:
        try:
            doc = json.loads(payload)
        except ValueError:
            return None, None
        if not isinstance(doc, dict):
            return None, None
        usage = doc.get("usage")
        metrics = doc.get("metrics")
        speculative = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
    return (
        usage if isinstance(usage, dict) else None,
        speculative if isinstance(speculative, dict) else None,
    )


_NOT_FOUND: Final = object()
_UNSURE: Final = object()


def _object_after(payload: bytes, key: bytes) -> object:
    """The JSON object that is the value of the last `key` in `payload`, decoded alone."""
    at = payload.rfind(key)
    if at < 0:
        return _NOT_FOUND
    tail = payload[at + len(key) :].lstrip()
    if not tail.startswith(b":"):
        return _UNSURE
    tail = tail[1:].lstrip()
    if not tail.startswith((b"{", b"n")):
        return _UNSURE
    try:
        value, _ = _DECODER.raw_decode(tail.decode("utf-8", "replace"))
    except ValueError:
        return _UNSURE
    return value


def _is_event_stream(upstream: _Reply) -> bool:
    return upstream.headers.get("Content-Type", "").startswith("text/event-stream")


def _request_headers(headers: CIMultiDictProxy[str]) -> CIMultiDict[str]:
    connection = headers.get("Connection")
    drop = _DROP_REQUEST
    if connection:
        drop = drop | {token.strip().lower() for token in connection.split(",")}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in drop)


def _raw_request_headers(request: web.BaseRequest) -> bytes:
    """`_request_headers` for the lean client: the client's raw header lines, minus the same
    dropped ones, joined without decoding (aiohttp's parser already rejected CR/LF in them)."""
    drop = _DROP_REQUEST_BYTES
    connection = request.headers.get("Connection")
    if connection:
        drop = drop | {t.strip().lower().encode("latin-1") for t in connection.split(",")}
    return b"".join(
        [
            name + b": " + value + b"\r\n"
            for name, value in request.raw_headers
            if name.lower() not in drop
        ]
    )


def _response_headers(
    headers: Mapping[str, str], arm: Arm, request_id: str
) -> list[tuple[str, str]]:
    """The upstream's headers minus dropped ones, plus ours: a list, since aiohttp's response
    copies what it is given into its own CIMultiDict anyway."""
    drop = _DROP_RESPONSE
    out = [(k, v) for k, v in headers.items() if k.lower() not in drop]
    out.append((ARM_HEADER, arm.value))
    out.append((REQUEST_ID_HEADER, request_id))
    return out


def _classify(exc: BaseException, arm: Arm) -> _Failure:
    if isinstance(exc, TimeoutError):
        return _Failure("timeout", 504, "GatewayTimeout", f"the {arm.value} arm timed out")
    if isinstance(exc, UpstreamError) and exc.kind != "connect":
        return _Failure(
            exc.kind, 502, "BadGateway", f"the {arm.value} arm sent a broken response: {exc}"
        )
    return _Failure(
        "connect", 502, "BadGateway", f"the {arm.value} arm could not be reached: {exc}"
    )


def _safe_path(raw: str) -> bool:
    """Origin-form `/v1/...` paths only: no absolute URIs, dot segments or backslashes."""
    if not raw.startswith("/v1/") or "\\" in raw:
        return False
    path = raw.split("?", 1)[0]
    lowered = path.lower()
    if "%2e" in lowered or "%2f" in lowered or "%5c" in lowered or "//" in path:
        return False
    return all(segment not in (".", "..") for segment in path.split("/"))


def _json_error(
    status: int, error_type: str, message: str, request_id: str, arm: Arm | None = None
) -> web.Response:
    headers = {REQUEST_ID_HEADER: request_id}
    if arm is not None:
        headers[ARM_HEADER] = arm.value
    return web.Response(
        body=error_body(message, status=status, error_type=error_type),
        status=status,
        content_type="application/json",
        headers=headers,
    )


def _bad_request(request_id: str, message: str, param: str | None = None) -> web.Response:
    return web.Response(
        body=error_body(message, status=400, error_type="BadRequestError", param=param),
        status=400,
        content_type="application/json",
        headers={REQUEST_ID_HEADER: request_id},
    )


def _too_large(request_id: str, limit: int) -> web.Response:
    message = f"request body is larger than the proxy's limit of {limit} bytes"
    return _json_error(413, "RequestTooLarge", message, request_id)


async def _write_eof(resp: web.StreamResponse, request: web.Request | None = None) -> bool:
    """Finish a response ourselves, so that 'last byte written' is a real timestamp."""
    try:
        if request is not None:
            await resp.prepare(request)
        await resp.write_eof()
    except ConnectionError:
        return False
    return True


def _cut_off(request: web.Request) -> None:
    """End the client's response the way a broken upstream ended ours: close mid-body."""
    transport = request.transport
    if transport is not None:
        transport.close()


def _int_or_none(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)
