"""The load generator shared by `specproxy demo` and `specproxy bench`.

Two arrival models, because they answer different questions:

- open loop (`run_open_loop`): Poisson arrivals at a fixed rate, whatever the server does, like
  independent users. Latency under load and queueing show up honestly; a slow server does not
  slow the arrivals down (coordinated omission). Each result keeps its *lateness* (actual send
  time minus scheduled time), which shows whether the harness itself kept up.
- closed loop (`run_closed_loop`): a fixed number of clients, each sending its next request when
  the previous one finished; the classic benchmark for a given concurrency.

Every request is timed with `time.perf_counter` from just before the request is sent to the
last byte of the response. Streams are scanned by the proxy's own `SSEScanner` and every result
is derived by `specproxy.timing.derive`, so the harness and the proxy count the same content
events (text, reasoning, tool calls) and compute TTFT and TPOT the same way. The time the
harness spends scanning is measured too (`parse_ns`), so its overhead can be compared with the
latencies it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import numpy as np

from specproxy.errors import ErrorKind
from specproxy.prompts import Prompt
from specproxy.proxy.sse import SSEScanner
from specproxy.proxy.transports.aio import upstream_error
from specproxy.records import Arm, RequestRecord
from specproxy.timing import Measures, RequestTimings, derive

__all__ = [
    "ARM_HEADER",
    "ClientResult",
    "Endpoint",
    "LoadGenerator",
    "RequestOptions",
    "Target",
    "poisson_gaps",
]

ARM_HEADER = "x-specproxy-arm"  # response header naming the arm that served a proxied request
Endpoint = Literal["chat.completions", "completions"]
_PATHS: dict[str, str] = {
    "chat.completions": "/v1/chat/completions",
    "completions": "/v1/completions",
}


@dataclass(frozen=True, slots=True)
class Target:
    """An OpenAI-compatible base URL; `arm` labels a direct arm, None means the proxy decides."""

    base_url: str
    arm: Arm | None = None


@dataclass(frozen=True, slots=True)
class RequestOptions:
    """What every request of a run looks like (the prompt varies, these do not)."""

    model: str
    endpoint: Endpoint = "chat.completions"
    stream: bool = True
    temperature: float = 0.0
    max_tokens_cap: int | None = None  # clamp the prompts' own budgets (fast demos, tests)
    ignore_eos: bool = False  # vLLM's extension: generate exactly max_tokens (fixed lengths)
    headers: tuple[tuple[str, str], ...] = ()

    def body(self, prompt: Prompt) -> dict[str, Any]:
        max_tokens = prompt.max_tokens
        if self.max_tokens_cap is not None:
            max_tokens = min(max_tokens, self.max_tokens_cap)
        body: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": self.stream,
        }
        if self.endpoint == "chat.completions":
            body["messages"] = prompt.chat_messages()
        else:
            body["prompt"] = prompt.text()
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return body


@dataclass(frozen=True, slots=True)
class ClientResult:
    """One request as the client saw it: its `measures` come from `specproxy.timing.derive`, the
    same derivation the proxy uses, so a bench row and a proxy row mean the same thing."""

    index: int
    arm: Arm | None
    t_start: float  # Unix time the request was sent
    temperature: float
    measures: Measures
    lateness_ns: int = 0  # open loop: actual send time minus the Poisson schedule
    parse_ns: int = 0  # harness time spent scanning the response

    @property
    def ok(self) -> bool:
        return self.error_kind is None and 200 <= self.status < 300

    @property
    def status(self) -> int:
        return self.measures.status

    @property
    def error_kind(self) -> ErrorKind | None:
        return self.measures.error_kind

    @property
    def e2e_ns(self) -> int:
        return round(self.measures.e2e_s * 1e9)

    @property
    def ttft_ns(self) -> int | None:
        ttft = self.measures.ttft_s
        return round(ttft * 1e9) if ttft is not None else None

    @property
    def n_events(self) -> int:
        return self.measures.n_events

    @property
    def prompt_tokens(self) -> int | None:
        return self.measures.prompt_tokens

    @property
    def output_tokens(self) -> int | None:
        return self.measures.output_tokens

    @property
    def max_gap_ns(self) -> int | None:
        gap = self.measures.max_gap_s
        return round(gap * 1e9) if gap is not None else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.measures.acceptance_rate

    @property
    def mean_acceptance_length(self) -> float | None:
        return self.measures.mean_acceptance_length

    def to_record(self, *, run_id: str, options: RequestOptions) -> RequestRecord:
        """A store row, so that bench runs feed the same statistics and report as the proxy."""
        if self.arm is None:
            raise ValueError("a result without an arm cannot be recorded")
        return self.measures.record(
            request_id=uuid.uuid4().hex,
            run_id=run_id,
            arm=self.arm,
            t_start=self.t_start,
            model=options.model,
            endpoint=options.endpoint,
            stream=options.stream,
        )


def poisson_gaps(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """Exponential inter-arrival gaps (seconds) of a Poisson process with `rate` per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    while True:
        yield float(rng.exponential(1.0 / rate))


OnResult = Callable[[ClientResult], None]


class LoadGenerator:
    """Sends prompts to one or more targets and times every response."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        targets: Sequence[Target],
        prompts: Sequence[Prompt],
        options: RequestOptions,
        *,
        seed: int = 0,
        max_inflight: int = 1024,
    ) -> None:
        if not targets:
            raise ValueError("at least one target is needed")
        if not prompts:
            raise ValueError("at least one prompt is needed")
        self.session = session
        self.targets = tuple(targets)
        self.prompts = tuple(prompts)
        self.options = options
        self.max_inflight = max_inflight
        self.skipped = 0  # open-loop arrivals dropped because max_inflight was reached
        self._rng = np.random.default_rng(seed)
        self._index = 0
        self._round: tuple[Prompt, list[int]] | None = None

    def _next(self) -> tuple[int, Target, Prompt]:
        """Balanced rounds: each prompt (drawn at random) goes to every target once, in an
        order shuffled per round, so the arms get the same prompts and counts within one."""
        index = self._index
        self._index += 1
        slot = index % len(self.targets)
        if slot == 0 or self._round is None:
            prompt = self.prompts[int(self._rng.integers(len(self.prompts)))]
            self._round = (prompt, [int(i) for i in self._rng.permutation(len(self.targets))])
        prompt, order = self._round
        return index, self.targets[order[slot]], prompt

    async def send(
        self, index: int, target: Target, prompt: Prompt, *, lateness_ns: int = 0
    ) -> ClientResult:
        """One request, timed from just before sending to the last byte of the response."""
        opts = self.options
        url = target.base_url.rstrip("/") + _PATHS[opts.endpoint]
        body = json.dumps(opts.body(prompt)).encode()
        headers = {"content-type": "application/json", **dict(opts.headers)}
        t_start = time.time()
        t0 = time.perf_counter()
        timings = RequestTimings(request_start=t0, upstream_start=t0)
        arm = target.arm
        parse_ns = 0
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                timings.status = resp.status
                served_by = resp.headers.get(ARM_HEADER)
                if arm is None and served_by in ("speculative", "baseline"):
                    arm = Arm(served_by)
                if resp.status >= 400:
                    await resp.read()
                    timings.fail(ErrorKind.HTTP_4XX if resp.status < 500 else ErrorKind.HTTP_5XX)
                elif resp.headers.get("Content-Type", "").startswith("text/event-stream"):
                    parse_ns = await _read_events(resp, timings)
                else:
                    parse_ns = _read_body(await resp.read(), timings)
        except (aiohttp.ClientError, TimeoutError, ConnectionRefusedError) as exc:
            timings.fail(upstream_error(exc).kind)  # the proxy's one mapping of aiohttp's errors
        except (json.JSONDecodeError, UnicodeDecodeError):
            timings.fail(ErrorKind.BROKEN)
        end = time.perf_counter()
        timings.request_end = end
        if timings.upstream_end is None:
            timings.upstream_end = end
        return ClientResult(
            index=index,
            arm=arm,
            t_start=t_start,
            temperature=opts.temperature,
            measures=derive(timings, end),
            lateness_ns=lateness_ns,
            parse_ns=parse_ns,
        )

    async def run_open_loop(
        self,
        rate: float,
        *,
        count: int | None = None,
        duration_s: float | None = None,
        stop: asyncio.Event | None = None,
        on_result: OnResult | None = None,
        drain_timeout_s: float = 30.0,
    ) -> list[ClientResult]:
        """Poisson arrivals at `rate`/s until `count` requests, `duration_s` or `stop`."""
        _check_bounds(count, duration_s, stop)
        results: list[ClientResult] = []
        inflight: set[asyncio.Task[ClientResult]] = set()
        loop = asyncio.get_running_loop()
        start = loop.time()
        due = start
        sent = 0

        def done(task: asyncio.Task[ClientResult]) -> None:
            inflight.discard(task)
            if not task.cancelled() and task.exception() is None:
                result = task.result()
                results.append(result)
                if on_result is not None:
                    on_result(result)

        for gap in poisson_gaps(rate, self._rng):
            due += gap
            if count is not None and sent >= count:
                break
            if duration_s is not None and due - start >= duration_s:
                break
            if await _sleep_or_stop(due - loop.time(), stop):
                break
            if len(inflight) >= self.max_inflight:
                self.skipped += 1
                continue
            index, target, prompt = self._next()
            lateness = max(0, round((loop.time() - due) * 1e9))
            task = asyncio.create_task(self.send(index, target, prompt, lateness_ns=lateness))
            inflight.add(task)
            task.add_done_callback(done)
            sent += 1
        await _drain(inflight, drain_timeout_s)
        return sorted(results, key=lambda r: r.index)

    async def run_closed_loop(
        self,
        concurrency: int,
        *,
        count: int | None = None,
        duration_s: float | None = None,
        stop: asyncio.Event | None = None,
        on_result: OnResult | None = None,
    ) -> list[ClientResult]:
        """`concurrency` clients back to back until `count` requests, `duration_s` or `stop`."""
        _check_bounds(count, duration_s, stop)
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        results: list[ClientResult] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_s if duration_s is not None else None
        budget = [count]

        def claim() -> bool:
            if stop is not None and stop.is_set():
                return False
            if deadline is not None and loop.time() >= deadline:
                return False
            if budget[0] is not None:
                if budget[0] <= 0:
                    return False
                budget[0] -= 1
            return True

        async def client() -> None:
            while claim():
                index, target, prompt = self._next()
                result = await self.send(index, target, prompt)
                results.append(result)
                if on_result is not None:
                    on_result(result)

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return sorted(results, key=lambda r: r.index)


async def _read_events(resp: aiohttp.ClientResponse, timings: RequestTimings) -> int:
    """Scan a streamed response with the proxy's own `SSEScanner`, stamping every chunk as it
    arrives; returns the nanoseconds spent scanning."""
    scanner = SSEScanner()
    timings.events = scanner
    content = resp.content
    perf_counter = time.perf_counter
    spent = 0.0
    while chunk := await content.readany():
        now = perf_counter()
        timings.upstream_end = now
        scanner.feed(chunk, now)
        spent += perf_counter() - now
    scanner.finish()
    return round(spent * 1e9)


def _read_body(raw: bytes, timings: RequestTimings) -> int:
    """`usage` and `metrics.speculative_decoding` of a non-streaming body; returns the parse
    nanoseconds. A body that is not JSON raises `JSONDecodeError` (a broken response)."""
    timings.upstream_end = now = time.perf_counter()
    doc = json.loads(raw)
    if isinstance(doc, dict):
        usage = doc.get("usage")
        metrics = doc.get("metrics")
        speculative = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        timings.usage = usage if isinstance(usage, dict) else None
        timings.speculative = speculative if isinstance(speculative, dict) else None
    return round((time.perf_counter() - now) * 1e9)


def _check_bounds(count: int | None, duration_s: float | None, stop: asyncio.Event | None) -> None:
    if count is None and duration_s is None and stop is None:
        raise ValueError("give a count, a duration or a stop event, or the load never ends")


async def _sleep_or_stop(delay: float, stop: asyncio.Event | None) -> bool:
    """Sleep `delay` seconds; True when `stop` was set meanwhile."""
    if stop is None:
        if delay > 0:
            await asyncio.sleep(delay)
        return False
    if stop.is_set():
        return True
    if delay > 0:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), delay)
    return stop.is_set()


async def _drain(tasks: set[asyncio.Task[ClientResult]], timeout_s: float) -> None:
    """Let requests in flight finish, cancelling whatever is still running after `timeout_s`."""
    if not tasks:
        return
    pending = set(tasks)
    _, still = await asyncio.wait(pending, timeout=timeout_s)
    for task in still:
        task.cancel()
    if still:
        await asyncio.gather(*still, return_exceptions=True)
