"""The request lifecycle: pick an arm, forward, stream the answer back, time it, record it.

Timing is taken on the side: request received -> upstream headers -> first content event ->
every event -> last byte written. Every call to an arm, primary or shadow, ends in exactly one
`RequestRecord`, whatever happens (success, upstream error, client disconnect, shutdown): the
call's trace is handed over in a `finally` block, and its record is made in the loop's spare
moment, while the next call waits for its engine (`backlog`: at most 0.5 ms later, and before
anything reads the recorder or the metrics).

Failure mapping: refused/unreachable -> 502, connect or read timeout before the headers -> 504
(OpenAI-style JSON); upstream 4xx/5xx pass through; a stream that breaks mid-way is cut off the
same way for the client (no synthetic end); a client that goes away closes the upstream
connection, which makes vLLM abort the generation.

Failing open (`proxy.endpoints`): a request routed to a treatment arm that is down is served by
the control arm (`[<arm>] on_down = "control"`, the default), recorded with `rerouted_from` and
counted in `specproxy_rerouted_requests_total`; it is mirrored to no arm, since its shadow would
be the control too. The control arm never fails over to a treatment.

The concerns live beside this module: `relay` (answer to the client), `shadow` (mirrored calls),
`headers`, `usage` (usage injection and reading), `observe` (Prometheus), `trace` (the record),
`backlog` (when the record is made).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Mapping
from typing import Final

from aiohttp import ClientSession, web

from specproxy.config import Config
from specproxy.errors import ErrorKind, UpstreamError
from specproxy.fleet.arms import Fleet
from specproxy.fleet.pool import EndpointPool
from specproxy.metrics import ProxyMetrics
from specproxy.proxy.accesslog import AccessLog
from specproxy.proxy.armauth import every_arm_headers
from specproxy.proxy.backlog import Backlog
from specproxy.proxy.conditions import Categories, temperature_of
from specproxy.proxy.endpoints import EngineLoad, Upstreams
from specproxy.proxy.headers import (
    REQUEST_ID_HEADER,
    OutboundHeaders,
    response_headers,
    safe_path,
)
from specproxy.proxy.limits import ALLOWED_METHODS, Rejection, header_rejection, json_too_deep
from specproxy.proxy.observe import Observer
from specproxy.proxy.relay import (
    bad_request,
    cut_off,
    headers_too_large,
    json_error,
    method_not_allowed,
    relay,
    send_error,
    too_deep,
    too_large,
    upstream_error_response,
)
from specproxy.proxy.routing import FORCED_ARM_HEADER, ForcedArmError, Router, router_of
from specproxy.proxy.shadow import Shadows
from specproxy.proxy.trace import STATUS_CLIENT_GONE, RequestIds, Trace
from specproxy.proxy.tracing import open_tracing
from specproxy.proxy.transports.base import Reply
from specproxy.proxy.transports.select import Mode, TransportFactory, default_transports
from specproxy.proxy.usage import should_inject, with_usage
from specproxy.records import Arm, ReadBarrier, Recorder, RequestRecord

__all__ = ["MEASURED_ENDPOINTS", "Forwarder"]

log = logging.getLogger(__name__)

# URL path -> the `endpoint` value of the record.
MEASURED_ENDPOINTS: Final = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat.completions",
}


def _up(pool: EndpointPool) -> float:
    """`specproxy_arm_up`: 1 while the arm has an endpoint in rotation."""
    return 0.0 if pool.down else 1.0


class Forwarder:
    """Serves the proxied routes for one app; owns the routing RNG and the shadow tasks."""

    def __init__(
        self,
        cfg: Config,
        *,
        sessions: Mapping[Arm, ClientSession],
        recorder: Recorder,
        metrics: ProxyMetrics,
        fleet: Fleet | None = None,
        transports: TransportFactory | None = None,
        router: Router | None = None,
        engine_load: EngineLoad | None = None,
    ) -> None:
        """`transports` makes each endpoint's transports (default: `default_transports` over
        `sessions`); tests pass one that returns `MockTransport`s. `router`: the app's, whose
        share `control.live` changes at run time (default: one of `cfg.routing`'s own).
        `engine_load`: each endpoint's load at its latest scrape (`EngineScraper.engine_load`),
        recorded with every call."""
        self._cfg = cfg
        self._run_id = cfg.run_id
        self._recorder = recorder
        self._metrics = metrics
        fleet = fleet if fleet is not None else Fleet(cfg)
        self._observer = Observer(metrics, fleet.labels.label, fleet.arms)
        for arm in fleet.arms:
            metrics.arm_up.labels(arm).set_function(functools.partial(_up, fleet.pool(arm)))
            role = "control" if arm == cfg.control_arm else "treatment"
            # `[arms.NAME] labels` ride along as label_KEY (kube-state-metrics' form), so the
            # dashboard shows them and no key can collide with arm or role
            labels = {f"label_{k}": v for k, v in cfg.arm_config(arm).labels.items()}
            metrics.arm_role.labels(arm).info({"role": role, **labels})
        fail_open = [arm for arm in cfg.treatment_arms if cfg.arm_config(arm).on_down == "control"]
        self._router = router if router is not None else router_of(cfg)
        self._control = cfg.control_arm
        self._mirror_enabled = cfg.routing.mirror_fraction > 0
        self._inject_usage = cfg.inject_usage
        self._max_body = cfg.max_body_bytes
        self._max_event = cfg.max_event_bytes
        # Each arm is a pool of endpoints; each endpoint has its own transports, chosen once per
        # mode (`transports.select`), e.g. the lean client for plain-http engines.
        self._upstreams = Upstreams(
            fleet,
            transports or default_transports(sessions, cfg.arm_timeouts),
            fail_open,
            every_arm_headers(cfg),
            engine_load,
        )
        self._category_header = cfg.segments.category_header
        self._categories = Categories(cfg.segments.categories_max)
        self._new_id = RequestIds()
        self._tracing = open_tracing(cfg.telemetry)  # None: off, nothing of OpenTelemetry loaded
        telemetry = cfg.telemetry
        self._access = AccessLog(telemetry.access_log_per_s) if telemetry.access_log else None
        # Records are made in the loop's spare moment (`proxy.backlog`), unless a span or an
        # access-log line must carry the moment each call ended.
        self._backlog = Backlog(self._record, defer=self._tracing is None and self._access is None)
        if isinstance(recorder, ReadBarrier):
            recorder.before_reads(self._backlog.settle)
        metrics.before_collect(self._backlog.settle)
        self._shadows = Shadows(
            upstreams=self._upstreams,
            new_id=self._new_id,
            finish=self._backlog.add,
            skipped=self._observer.shadow_skipped,
            cap=cfg.routing.max_concurrent_shadows,
            inject_usage=self._inject_usage,
        )

    # ----------------------------------------------------------------------- lifecycle

    async def close(self) -> None:
        """Cancel shadows still running; each still writes its record."""
        await self._shadows.close()
        self._backlog.close()  # calls still running record at once from now on
        await self._upstreams.close()
        if self._tracing is not None:
            await asyncio.to_thread(self._tracing.close)  # exports the spans left

    @property
    def active_shadows(self) -> int:
        return self._shadows.active

    # ----------------------------------------------------------------------- handlers

    async def measured(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/completions and /v1/chat/completions: routed, timed and recorded."""
        received = time.perf_counter()
        t_start = time.time()
        request_id = self._new_id()
        endpoint = MEASURED_ENDPOINTS[request.path]
        problem = header_rejection(request.raw_headers)
        if problem is not None:
            return self._reject(Rejection.HEADERS_TOO_LARGE, headers_too_large(request_id, problem))
        length = request.content_length
        if length is not None and length > self._max_body:
            return self._reject(Rejection.BODY_TOO_LARGE, too_large(request_id, self._max_body))
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reject(Rejection.BODY_TOO_LARGE, too_large(request_id, self._max_body))
        try:
            doc = json.loads(body)
        except RecursionError:  # C scanner at the interpreter's limit: far past MAX_JSON_DEPTH
            return self._reject(Rejection.JSON_TOO_DEEP, too_deep(request_id))
        except ValueError as exc:
            return self._reject(
                Rejection.INVALID_JSON,
                bad_request(request_id, f"request body is not valid JSON: {exc}"),
            )
        if not isinstance(doc, dict):
            return self._reject(
                Rejection.INVALID_JSON,
                bad_request(request_id, "request body must be a JSON object"),
            )
        if json_too_deep(body, doc):
            return self._reject(Rejection.JSON_TOO_DEEP, too_deep(request_id))
        try:
            arm = self._router.choose(request.headers, doc.get("user"))
        except ForcedArmError as exc:
            return self._refused(bad_request(request_id, str(exc), param=FORCED_ARM_HEADER))
        model = doc.get("model")
        model = model if isinstance(model, str) else ""
        stream = doc.get("stream") is True
        strip_usage = stream and self._inject_usage and should_inject(doc)
        upstream_body = with_usage(doc, body) if strip_usage else body
        pair_id = None
        shadow_arm = (
            self._router.shadow_arm(arm)
            if self._mirror_enabled
            and self._router.mirror()
            and not self._failing_open(arm)  # its shadow would go to the control as well
            else None
        )
        if shadow_arm is not None:
            pair_id = request_id
            self._shadows.start(
                shadow_arm,
                request.path,
                endpoint,
                doc,
                body,
                strip_usage,
                upstream_body,
                OutboundHeaders.of(request),
                model,
                stream,
                pair_id,
            )
        trace = Trace(
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
        trace.temperature = temperature_of(doc)
        trace.category = self._categories.of(request.headers.get(self._category_header))
        return await self._primary(request, trace, upstream_body, strip_usage)

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        """Any other /v1/* request: forwarded to the control arm, streamed, not measured."""
        request_id = self._new_id()
        arm = self._control
        if request.method not in ALLOWED_METHODS:
            return self._reject(
                Rejection.METHOD_NOT_ALLOWED, method_not_allowed(request_id, request.method)
            )
        raw = request.raw_path
        if not safe_path(raw):
            return self._refused(
                json_error(400, "BadRequestError", f"refusing to proxy path {raw!r}", request_id)
            )
        problem = header_rejection(request.raw_headers)
        if problem is not None:
            return self._reject(Rejection.HEADERS_TOO_LARGE, headers_too_large(request_id, problem))
        started = time.perf_counter()
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._reject(Rejection.BODY_TOO_LARGE, too_large(request_id, self._max_body))
        outcome: list[ErrorKind | None] = [ErrorKind.DISCONNECTED]  # until the answer is over
        status = STATUS_CLIENT_GONE
        try:
            resp = await self._forward(request, request_id, arm, body, outcome)
            status = resp.status
            return resp
        finally:
            if self._access is not None:
                e2e_s = time.perf_counter() - started
                self._access.passthrough(request_id, arm, request.path, status, e2e_s, outcome[0])

    async def _forward(
        self,
        request: web.Request,
        request_id: str,
        arm: Arm,
        body: bytes,
        outcome: list[ErrorKind | None],
    ) -> web.StreamResponse:
        """`passthrough`'s call to the arm and its answer relayed; `outcome[0]` becomes the
        error kind (None: the answer went through whole, below 400)."""
        endpoint, clients = self._upstreams.pick(arm)
        transport = clients.transports[Mode.PASSTHROUGH]
        try:
            headers = self._upstreams.headers_to(arm, OutboundHeaders.of(request))
            upstream = await transport.send(request.method, request.raw_path, body or None, headers)
        except UpstreamError as exc:
            self._upstreams.done(arm, endpoint, exc.kind)
            outcome[0] = exc.kind
            return upstream_error_response(exc, request_id, arm)
        except BaseException:  # cancelled: the client went away
            self._upstreams.done(arm, endpoint, ErrorKind.CANCELLED)
            raise
        self._upstreams.done(arm, endpoint, ErrorKind.of_status(upstream.status))
        resp = web.StreamResponse(
            status=upstream.status,
            reason=upstream.reason,
            headers=response_headers(upstream.forwarded, arm, request_id),
        )
        if upstream.content_length is not None:
            resp.content_length = upstream.content_length
        complete = False
        try:
            await resp.prepare(request)
            while chunk := await upstream.readany():
                await resp.write(chunk)
            await resp.write_eof()
            complete = True
            outcome[0] = ErrorKind.of_status(upstream.status)
        except UpstreamError as exc:
            outcome[0] = exc.kind
            cut_off(request)
        except ConnectionError:
            pass  # the client went away
        finally:
            if complete:
                upstream.release()
            else:
                upstream.close()
        return resp

    def _failing_open(self, arm: Arm) -> bool:
        """Whether a request for `arm` goes to the control now (a mirror of it is skipped)."""
        upstreams = self._upstreams
        if upstreams.fails_open(arm) and upstreams.down(arm):
            self._observer.shadow_skipped()
            return True
        return False

    # ----------------------------------------------------------------------- primary path

    async def _primary(
        self,
        request: web.Request,
        trace: Trace,
        body: bytes,
        strip_usage: bool,
    ) -> web.StreamResponse:
        arm = trace.arm
        inflight = self._observer.inflight
        inflight[arm] += 1
        upstream: Reply | None = None
        headers = OutboundHeaders.of(request)
        spans = None if self._tracing is None else self._tracing.start(request.headers, trace)
        try:
            if spans is not None:
                headers = headers.adding(spans.upstream_start(trace))
            trace.upstream_start = time.perf_counter()
            self._backlog.soon()  # the records of calls already over, made while this one waits
            try:
                upstream = await self._upstreams.send(
                    trace,
                    Mode.measured(trace.stream),
                    request.path,
                    body,
                    headers,
                )
            except UpstreamError as exc:
                return await send_error(request, trace, exc)
            return await relay(request, trace, upstream, strip_usage, self._max_event)
        except asyncio.CancelledError:
            trace.disconnected = True
            trace.fail(ErrorKind.DISCONNECTED, STATUS_CLIENT_GONE)
            raise
        finally:
            inflight[arm] -= 1
            self._upstreams.end(trace, upstream)
            if spans is not None:
                spans.upstream_end(trace)
            if spans is None and self._access is None:
                self._backlog.add(trace)
            else:  # a span or an access-log line carries the moment the call ended: now
                rec = self._record(trace, time.perf_counter())
                if spans is not None:
                    spans.end(trace, rec)
                if self._access is not None and rec is not None:
                    self._access.request(rec)

    # ----------------------------------------------------------------------- recording

    def _reject(self, reason: Rejection, response: web.Response) -> web.Response:
        """A request the proxy answers itself: counted by reason, never forwarded or recorded
        (the access log has its line)."""
        self._observer.rejected(reason)
        if self._access is not None:
            request_id = response.headers.get(REQUEST_ID_HEADER, "")
            self._access.rejected(request_id, response.status, reason.value)
        return response

    def _refused(self, response: web.Response) -> web.Response:
        """A 400 the proxy answers for a request that is no limit's (an unknown forced arm, a
        path it will not forward): not counted as a rejection, but the access log has its line."""
        if self._access is not None:
            request_id = response.headers.get(REQUEST_ID_HEADER, "")
            self._access.rejected(request_id, response.status, "bad_request")
        return response

    def settle(self) -> None:
        """The read barrier: every call already over is in the recorder and the metrics now
        (`proxy.backlog`)."""
        self._backlog.settle()

    def _record(self, trace: Trace, ended: float) -> RequestRecord | None:
        """Hand the record to the recorder and the Prometheus collectors, and return it (None
        if it could not be made); never raises."""
        try:
            rec = trace.to_record(self._run_id, ended)
        except Exception:  # a bug here must not lose the response; log it loudly
            log.exception("could not build the record of request %s", trace.request_id)
            return None
        self._recorder.record(rec)
        self._observer.observe(rec, trace.scanner.gaps if trace.scanner is not None else ())
        came, reason = rec.rerouted_from, rec.reroute_reason
        if came is not None and reason is not None:
            self._metrics.rerouted.labels(came, rec.arm, reason.value).inc()
        return rec
