"""An aiohttp server that answers like vLLM 0.32 and runs on `model.Engine` (`specproxy emulate`).

One engine task per server steps every running sequence together, sleeping each step's modelled
duration on the wall clock, so batching effects are physical: a request slows down because others
share its steps, not because a per-request formula says so. Step deadlines are kept on an
absolute clock, so event-loop jitter delays an event but never accumulates into the timing, and
the engine stamps tokens (per-request `metrics`, /metrics histograms) with that clock: what the
server reports is the modelled timing, exact whatever the machine's load (a loop more than
`MAX_LAG_S` behind restarts the clock at now, and that lag is then reported too).

Admin endpoints (for tests and the demo, not part of vLLM):
  GET  /emulator/config   current live knobs and engine start time
  POST /emulator/config   JSON patch of live knobs, e.g. {"slowdown": 3.0, "acceptance": 0.2}
                          (keys: `config.LIVE_KNOBS`); 400 on unknown keys or bad values
  POST /emulator/restart  engine restart: in-flight connections drop, counters reset,
                          process_start_time_seconds moves, warm-up starts again
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import random
import secrets
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from aiohttp import web

import specproxy.emulator.protocol as protocol
import specproxy.emulator.vocab as vocab
from specproxy.emulator.config import LIVE_KNOBS, EmulatorConfig
from specproxy.emulator.model import Engine, Physics, SeqOutput, Sequence
from specproxy.emulator.protocol import Choice, GenerationRequest, RequestError
from specproxy.emulator.vllm_metrics import EngineMetrics

__all__ = [
    "EMULATOR_KEY",
    "VLLM_VERSION",
    "EmulatedEngine",
    "create_emulator_app",
    "run_emulator",
]

log = logging.getLogger(__name__)

VLLM_VERSION = "0.32.0"
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
MAX_LAG_S = 0.5  # a step later than this is not caught up on: the engine clock restarts at now


class _Restarted:
    """Put in a request's queue when the engine restarts under it."""


_RESTARTED = _Restarted()
Item = SeqOutput | _Restarted


class EmulatedEngine:
    """The engine loop of one server, its live physics, and the metrics of its current life."""

    def __init__(self, cfg: EmulatorConfig) -> None:
        self.cfg = cfg
        self.physics = cfg.physics()
        self.fingerprint = f"vllm-{VLLM_VERSION}-{zlib.crc32(repr(cfg).encode()):08x}"
        self._wake = asyncio.Event()
        self._counter = 0
        self._new_life()

    def _new_life(self) -> None:
        self.engine = Engine(
            self.physics, max_num_seqs=self.cfg.max_num_seqs, draw_token=vocab.draw_token
        )
        self.start_time = time.time()
        self.created = int(self.start_time)
        self.metrics = EngineMetrics(
            model=self.cfg.model,
            speculative=self.cfg.speculative,
            k=self.cfg.num_speculative_tokens,
            version=self.cfg.metrics_version,
            start_time=self.start_time,
            max_model_len=self.cfg.max_model_len,
        )
        self.sinks: dict[str, asyncio.Queue[Item]] = {}

    # -- control -------------------------------------------------------------------------------

    def patch(self, knobs: dict[str, Any]) -> Physics:
        """Change live physics knobs; raises ValueError naming the bad one."""
        unknown = sorted(set(knobs) - set(LIVE_KNOBS))
        if unknown:
            raise ValueError(
                f"unknown knob(s): {', '.join(unknown)}; known: {', '.join(LIVE_KNOBS)}"
            )
        for name, value in knobs.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number, got {value!r}")
        physics = dataclasses.replace(self.physics, **knobs)  # validates in __post_init__
        self.physics = physics
        self.engine.physics = physics
        return physics

    def restart(self) -> None:
        """Drop everything in flight and start a new engine life (counters, start time, warm-up)."""
        sinks = self.sinks
        self._new_life()
        for sink in sinks.values():
            sink.put_nowait(_RESTARTED)
        self._wake.set()

    # -- requests ------------------------------------------------------------------------------

    def submit(self, req: GenerationRequest) -> tuple[str, list[Sequence], asyncio.Queue[Item]]:
        """Queue a request's sequences (one per prompt x n) on the engine."""
        now = asyncio.get_running_loop().time()
        request_id = secrets.token_hex(8)
        self._counter += 1
        seqs: list[Sequence] = []
        for p, prompt in enumerate(req.prompts):
            for i in range(req.n):
                key = self._rng_key(req, prompt, p * req.n + i)
                max_tokens = req.max_tokens or self.cfg.max_model_len - len(prompt)
                stop_after = None
                if req.max_tokens is None:
                    length_rng = random.Random(key + "/length")
                    stop_after = 1 + int(length_rng.expovariate(1 / self.cfg.default_output_tokens))
                seqs.append(
                    Sequence(
                        request_id=request_id,
                        index=p * req.n + i,
                        prompt_tokens=len(prompt),
                        max_tokens=max_tokens,
                        arrival=now,
                        token_rng=random.Random(key + "/tokens"),
                        accept_rng=random.Random(key + "/accept"),
                        stop_after=stop_after,
                    )
                )
        sink: asyncio.Queue[Item] = asyncio.Queue()
        self.sinks[request_id] = sink
        for seq in seqs:
            self.engine.add(seq)
        self.metrics.observe_request(n=req.n, max_tokens=seqs[0].max_tokens)
        self._wake.set()
        return request_id, seqs, sink

    def _rng_key(self, req: GenerationRequest, prompt: tuple[int, ...], index: int) -> str:
        """Greedy: a function of the prompt; seeded: of the seed; else of the request count."""
        digest = zlib.crc32(",".join(map(str, prompt)).encode())
        if req.temperature == 0:
            return f"{self.cfg.seed}/greedy/{digest}"
        if req.seed is not None:
            return f"{self.cfg.seed}/seed/{req.seed}/{digest}/{index}"
        return f"{self.cfg.seed}/request/{self._counter}/{index}"

    def release(self, request_id: str) -> None:
        """Forget a request; unfinished sequences are aborted (the client went away)."""
        if self.sinks.pop(request_id, None) is None:
            return
        now = asyncio.get_running_loop().time()
        for seq in self.engine.abort(request_id, now):
            self.metrics.observe_finished(seq)

    # -- the engine loop -----------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time()
        while True:
            engine = self.engine
            if not engine.has_work:
                self._wake.clear()
                await self._wake.wait()
                clock = loop.time()
                continue
            clock = max(clock, loop.time() - MAX_LAG_S)
            plan = engine.plan(clock)
            if plan is None:
                continue
            # A step cannot start before the requests it admits arrived (the loop may plan late).
            newest = max((s.arrival for s in plan.prefill), default=clock)
            if newest > clock:
                clock = newest
                plan = dataclasses.replace(plan, start=newest)
            clock += plan.duration_s
            await asyncio.sleep(max(0.0, clock - loop.time()))
            if engine is not self.engine:  # restarted during the step
                continue
            # Timestamps are the step's scheduled end, as an engine core stamps its own outputs:
            # the reported timings are the modelled ones, whatever the event loop's lag.
            result = engine.complete(plan, clock)
            kv_tokens = sum(s.prompt_tokens + s.generated for s in engine.running)
            self.metrics.observe_step(
                result,
                running=len(engine.running),
                waiting=len(engine.waiting),
                kv_usage=min(1.0, kv_tokens / self.cfg.kv_cache_tokens),
            )
            for out in result.outputs:
                sink = self.sinks.get(out.seq.request_id)
                if sink is not None:
                    sink.put_nowait(out)
            for seq in result.finished:
                self.metrics.observe_finished(seq)


EMULATOR_KEY = web.AppKey("emulator", EmulatedEngine)

# ---- handlers ---------------------------------------------------------------------------------


def _json(obj: Any, status: int = 200) -> web.Response:
    return web.Response(body=protocol.dumps(obj), status=status, content_type="application/json")


def _error(exc: RequestError) -> web.Response:
    return web.Response(body=exc.body(), status=exc.status, content_type="application/json")


async def _parse(request: web.Request, endpoint: protocol.Endpoint) -> GenerationRequest:
    emu = request.app[EMULATOR_KEY]
    raw = await request.read()
    return protocol.parse_request(
        endpoint, raw, served_model=emu.cfg.model, max_model_len=emu.cfg.max_model_len
    )


def _merge(items: list[SeqOutput]) -> list[SeqOutput]:
    """Outputs of one sequence that queued up while the client was slow become one event (vLLM's
    RequestOutputCollector does the same); order of first appearance is kept."""
    merged: dict[int, SeqOutput] = {}
    for item in items:
        prev = merged.get(id(item.seq))
        if prev is None:
            merged[id(item.seq)] = item
        else:
            merged[id(item.seq)] = SeqOutput(
                item.seq, prev.token_ids + item.token_ids, item.finish_reason, prev.gap_s
            )
    return list(merged.values())


def _drop_connection(request: web.Request) -> None:
    if request.transport is not None:
        request.transport.close()


def _metrics_block(
    emu: EmulatedEngine, req: GenerationRequest, seqs: list[Sequence], *, stream: bool
) -> dict[str, Any] | None:
    if not emu.cfg.per_request_metrics or len(seqs) != 1:
        return None
    spec = emu.cfg.speculative and emu.cfg.per_request_spec_metrics == "summary"
    return protocol.request_metrics(
        seqs[0], spec=spec, stream=stream, k=emu.cfg.num_speculative_tokens
    )


async def _generate(request: web.Request, endpoint: protocol.Endpoint) -> web.StreamResponse:
    emu = request.app[EMULATOR_KEY]
    try:
        req = await _parse(request, endpoint)
    except RequestError as exc:
        return _error(exc)
    request_id, seqs, sink = emu.submit(req)
    prefix = "chatcmpl-" if endpoint == "chat" else "cmpl-"
    try:
        if req.stream:
            return await _stream(request, emu, req, prefix + request_id, seqs, sink)
        return await _collect(request, emu, req, prefix + request_id, seqs, sink)
    finally:
        emu.release(request_id)


async def _collect(
    request: web.Request,
    emu: EmulatedEngine,
    req: GenerationRequest,
    response_id: str,
    seqs: list[Sequence],
    sink: asyncio.Queue[Item],
) -> web.StreamResponse:
    tokens: dict[int, list[int]] = {s.index: [] for s in seqs}
    pending = len(seqs)
    while pending:
        item = await sink.get()
        if isinstance(item, _Restarted):
            _drop_connection(request)
            return web.Response(status=503)
        tokens[item.seq.index].extend(item.token_ids)
        if item.finish_reason is not None:
            pending -= 1
    choices = [
        Choice(s.index, tuple(tokens[s.index]), req.prompts[s.index // req.n], s.finish_reason)
        for s in seqs
    ]
    metrics = _metrics_block(emu, req, seqs, stream=False)
    created = int(time.time())
    if req.endpoint == "chat":
        body = protocol.chat_body(
            request_id=response_id,
            created=created,
            model=req.model,
            choices=choices,
            return_token_ids=req.return_token_ids,
            prompt_token_ids=req.prompts[0],
            fingerprint=emu.fingerprint,
            metrics=metrics,
        )
    else:
        body = protocol.completion_body(
            request_id=response_id,
            created=created,
            model=req.model,
            choices=choices,
            return_token_ids=req.return_token_ids,
            prompt_tokens=req.prompt_tokens,
            fingerprint=emu.fingerprint,
            metrics=metrics,
        )
    return _json(body)


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + protocol.dumps(obj) + b"\n\n"


async def _stream(
    request: web.Request,
    emu: EmulatedEngine,
    req: GenerationRequest,
    response_id: str,
    seqs: list[Sequence],
    sink: asyncio.Queue[Item],
) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
    await response.prepare(request)
    created = int(time.time())
    started: set[int] = set()
    pending = len(seqs)
    completion_tokens = 0
    try:
        while pending:
            first = await sink.get()
            items = [first]
            while not sink.empty():
                items.append(sink.get_nowait())
            if any(isinstance(i, _Restarted) for i in items):
                _drop_connection(request)
                return response
            outputs = _merge([i for i in items if isinstance(i, SeqOutput)])
            events: list[bytes] = []
            if req.endpoint == "chat" and not started:
                for seq in seqs:
                    prompt_ids = req.prompts[0] if req.return_token_ids else None
                    events.append(
                        _event(
                            protocol.chat_role_chunk(
                                request_id=response_id,
                                created=created,
                                model=req.model,
                                index=seq.index,
                                prompt_token_ids=prompt_ids,
                            )
                        )
                    )
            for out in outputs:
                index = out.seq.index
                completion_tokens += len(out.token_ids)
                if out.finish_reason is not None:
                    pending -= 1
                if req.endpoint == "chat":
                    chunk = protocol.chat_content_chunk(
                        request_id=response_id,
                        created=created,
                        model=req.model,
                        index=index,
                        token_ids=out.token_ids,
                        finish_reason=out.finish_reason,
                        return_token_ids=req.return_token_ids,
                    )
                else:
                    chunk = protocol.completion_chunk(
                        request_id=response_id,
                        created=created,
                        model=req.model,
                        index=index,
                        token_ids=out.token_ids,
                        finish_reason=out.finish_reason,
                        return_token_ids=req.return_token_ids,
                        prompt_token_ids=None if index in started else req.prompts[index // req.n],
                    )
                started.add(index)
                if not pending and not req.include_usage and out is outputs[-1]:
                    chunk["system_fingerprint"] = emu.fingerprint  # the stream's last chunk
                events.append(_event(chunk))
            if not pending and req.include_usage:
                usage = protocol.usage_chunk(
                    endpoint=req.endpoint,
                    request_id=response_id,
                    created=created,
                    model=req.model,
                    prompt_tokens=req.prompt_tokens,
                    completion_tokens=completion_tokens,
                    fingerprint=emu.fingerprint,
                    metrics=_metrics_block(emu, req, seqs, stream=True),
                )
                events.append(_event(usage))
            if not pending:
                events.append(b"data: [DONE]\n\n")
            await response.write(b"".join(events))
        await response.write_eof()
    except (ConnectionResetError, asyncio.CancelledError):
        log.debug("client of %s went away", response_id)
        raise
    return response


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completions")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def models(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    perm = {
        "id": "modelperm-" + secrets.token_hex(8),
        "object": "model_permission",
        "created": emu.created,
        "allow_create_engine": False,
        "allow_sampling": True,
        "allow_logprobs": True,
        "allow_search_indices": False,
        "allow_view": True,
        "allow_fine_tuning": False,
        "organization": "*",
        "group": None,
        "is_blocking": False,
    }
    card = {
        "id": emu.cfg.model,
        "object": "model",
        "created": emu.created,
        "owned_by": "vllm",
        "root": emu.cfg.model_root,
        "parent": None,
        "max_model_len": emu.cfg.max_model_len,
        "permission": [perm],
    }
    return _json({"object": "list", "data": [card]})


async def health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return _json({"version": VLLM_VERSION})


async def metrics(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    return web.Response(body=emu.metrics.render(), headers={"Content-Type": METRICS_CONTENT_TYPE})


def _knobs(emu: EmulatedEngine) -> dict[str, Any]:
    return {
        "speculative": emu.cfg.speculative,
        "num_speculative_tokens": emu.cfg.num_speculative_tokens,
        "knobs": {name: getattr(emu.physics, name) for name in LIVE_KNOBS},
        "process_start_time_seconds": emu.start_time,
        "expected_speedup": emu.physics.expected_speedup() if emu.cfg.speculative else None,
    }


async def get_config(request: web.Request) -> web.Response:
    return _json(_knobs(request.app[EMULATOR_KEY]))


async def patch_config(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    try:
        patch = json.loads(await request.read())
        if not isinstance(patch, dict):
            raise ValueError("body must be a JSON object of knobs")
        emu.patch(patch)
    except ValueError as exc:  # JSONDecodeError is a ValueError
        body = protocol.error_json(str(exc), status=400, error_type="BadRequestError", param=None)
        return web.Response(body=body, status=400, content_type="application/json")
    return _json(_knobs(emu))


async def restart(request: web.Request) -> web.Response:
    emu = request.app[EMULATOR_KEY]
    emu.restart()
    return _json(_knobs(emu))


@web.middleware
async def _vllm_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Unknown routes and methods answer like FastAPI ({"detail": ...}), never with HTML."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return _json({"detail": exc.reason}, status=exc.status)


async def _server_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers["Server"] = "uvicorn"
    response.headers.setdefault("Vary", "Origin")


def create_emulator_app(cfg: EmulatorConfig) -> web.Application:
    """The emulated vLLM server as an aiohttp app; its engine loop lives in `cleanup_ctx`."""
    app = web.Application(middlewares=[_vllm_errors], client_max_size=32 * 1024 * 1024)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/emulator/config", get_config)
    app.router.add_post("/emulator/config", patch_config)
    app.router.add_post("/emulator/restart", restart)
    app.on_response_prepare.append(_server_header)

    async def engine_loop(app: web.Application) -> AsyncIterator[None]:
        emu = EmulatedEngine(cfg)
        app[EMULATOR_KEY] = emu
        task = asyncio.create_task(emu.run(), name=f"emulator-engine-{cfg.model}")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(engine_loop)
    return app


@contextlib.asynccontextmanager
async def run_emulator(
    cfg: EmulatorConfig, host: str = "127.0.0.1", port: int = 0
) -> AsyncIterator[str]:
    """Serve an emulator on `host:port` (0 = any free port); yields its base URL."""
    runner = web.AppRunner(create_emulator_app(cfg), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()
