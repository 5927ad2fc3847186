"""Test doubles for the scraper: V1 /metrics text, a fake /metrics server, a list recorder and a
round-robin balancer."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

from specproxy.records import EngineSample, GpuSample, RequestRecord


@dataclass
class EngineCounts:
    """Cumulative V1 counters and gauges of one data-parallel engine."""

    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted: float = 0.0
    per_pos: tuple[float, ...] = ()
    generation_tokens: float = 0.0
    running: float = 0.0
    waiting: float = 0.0
    kv_cache: float = 0.0


def v1_text(
    engines: Sequence[EngineCounts], *, start_time: float = 1.7e9, spec: bool = True
) -> str:
    """A V1-style /metrics page (same layout as the real 0.32.0 fixture) for these engines."""
    lines = [
        "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.",
        "# TYPE process_start_time_seconds gauge",
        f"process_start_time_seconds {start_time!r}",
    ]

    def family(name: str, kind: str, values: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {name}.")
        lines.append(f"# TYPE {name} {kind}")
        lines.extend(f"{name}{{{labels}}} {value!r}" for labels, value in values)

    def per_engine(value_of: str) -> list[tuple[str, float]]:
        return [
            (f'engine="{i}",model_name="m"', float(getattr(e, value_of)))
            for i, e in enumerate(engines)
        ]

    if spec:
        family("vllm:spec_decode_num_drafts_total", "counter", per_engine("drafts"))
        family("vllm:spec_decode_num_draft_tokens_total", "counter", per_engine("draft_tokens"))
        family("vllm:spec_decode_num_accepted_tokens_total", "counter", per_engine("accepted"))
        family(
            "vllm:spec_decode_num_accepted_tokens_per_pos_total",
            "counter",
            [
                (f'engine="{i}",model_name="m",position="{pos}"', value)
                for i, e in enumerate(engines)
                for pos, value in enumerate(e.per_pos)
            ],
        )
    family("vllm:num_requests_running", "gauge", per_engine("running"))
    family("vllm:num_requests_waiting", "gauge", per_engine("waiting"))
    family("vllm:kv_cache_usage_perc", "gauge", per_engine("kv_cache"))
    family("vllm:generation_tokens_total", "counter", per_engine("generation_tokens"))
    return "\n".join(lines) + "\n"


@dataclass
class FakeMetricsServer:
    """Serves `body` at GET /metrics with `status`, after `delay` seconds."""

    body: str = ""
    status: int = 200
    delay: float = 0.0
    content_type: str = "text/plain"
    hits: int = 0
    models: list[str] = field(default_factory=list)  # served at GET /v1/models

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self._handle)
        app.router.add_get("/v1/models", self._models)
        return app

    async def _models(self, request: web.Request) -> web.Response:
        data = [{"id": m, "object": "model"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.hits += 1
        if self.delay:
            await asyncio.sleep(self.delay)
        return web.Response(text=self.body, status=self.status, content_type=self.content_type)


@dataclass
class ListRecorder:
    """A `Recorder` (and `GpuRecorder`) that keeps everything in lists."""

    records: list[RequestRecord] = field(default_factory=list)
    engine_samples: list[EngineSample] = field(default_factory=list)
    gpu_samples: list[GpuSample] = field(default_factory=list)

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    def record_engine(self, sample: EngineSample) -> None:
        self.engine_samples.append(sample)

    def record_gpu(self, sample: GpuSample) -> None:
        self.gpu_samples.append(sample)


@dataclass
class RoundRobinBalancer:
    """One URL in front of several backends, each request to the next one (a ClusterIP Service
    or any load balancer): GETs and POSTs are passed on, bodies read whole. The rotation is kept
    per path, so the scrapes of /metrics take turns whatever else is asked in between."""

    backends: Sequence[str]
    session: aiohttp.ClientSession
    picks: dict[str, int] = field(default_factory=dict)  # requests so far, by path
    # a gateway's own /metrics (LiteLLM's, a router's), served instead of passing it on
    own_metrics: str | None = None
    # drop process_start_time_seconds from the backends' /metrics, as engines without one show
    # it (vLLM with --api-server-count > 1 serves a multiprocess registry, no process_* series)
    hide_start_time: bool = False

    def app(self) -> web.Application:
        app = web.Application()
        if self.own_metrics is not None:
            app.router.add_get("/metrics", self._metrics)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        return app

    async def _metrics(self, request: web.Request) -> web.Response:
        self.picks[request.path] = self.picks.get(request.path, 0) + 1
        return web.Response(text=self.own_metrics or "", content_type="text/plain")

    async def _forward(self, request: web.Request) -> web.Response:
        picks = self.picks.get(request.path, 0)
        self.picks[request.path] = picks + 1
        backend = self.backends[picks % len(self.backends)]
        body = await request.read()
        async with self.session.request(
            request.method, backend + request.path_qs, data=body or None, headers=_passed(request)
        ) as resp:
            data = await resp.read()
        if self.hide_start_time and request.path == "/metrics":
            lines = data.decode().splitlines(keepends=True)
            data = "".join(line for line in lines if "process_start_time" not in line).encode()
        return web.Response(body=data, status=resp.status, content_type=resp.content_type)


def _passed(request: web.Request) -> dict[str, str]:
    return {
        k: v for k, v in request.headers.items() if k.lower() in ("content-type", "authorization")
    }
