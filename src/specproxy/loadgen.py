"""The load generator shared by `specproxy demo` and `specproxy bench`.

Two arrival models, because they answer different questions:

- open loop (`run_open_loop`): Poisson arrivals at a fixed rate, whatever the server does, like
  independent users. Latency under load and queueing show up honestly; a slow server does not
  slow the arrivals down (coordinated omission). Each result keeps its *lateness* (actual send
  time minus scheduled time), which shows whether the harness itself kept up.
- closed loop (`run_closed_loop`): a fixed number of clients, each sending its next request when
  the previous one finished; the classic benchmark for a given concurrency.

With several targets (arms driven directly) each target gets its own stream, as if `vllm bench
serve` ran against it alone: its own closed-loop clients (`concurrency` per target) or its own
arrival process (`rate` per target), so a slow arm never holds back a fast one and per-arm
throughputs differ as the servers do. The streams are paired: every target draws the same prompts
in the same order, and in open loop the same arrival schedule. Arrivals are Poisson, or gamma with
shape `burstiness` and mean gap 1/rate (`vllm bench serve --burstiness`).

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
from specproxy.proxy.conditions import Categories
from specproxy.proxy.sse import SSEScanner
from specproxy.proxy.transports.aio import upstream_error
from specproxy.records import Arm, RequestRecord
from specproxy.timing import Measures, RequestTimings, derive

__all__ = [
    "ARM_HEADER",
    "ARM_NAME_MAX",
    "CATEGORY_HEADER",
    "ClientResult",
    "Endpoint",
    "LoadGenerator",
    "RequestOptions",
    "Target",
    "arrival_gaps",
    "poisson_gaps",
]

ARM_HEADER = "x-specproxy-arm"  # response header naming the arm that served a proxied request
CATEGORY_HEADER = "x-specproxy-category"  # request header: the prompt's category (bench sends it)
Endpoint = Literal["chat.completions", "completions"]
_PATHS: dict[str, str] = {
    "chat.completions": "/v1/chat/completions",
    "completions": "/v1/completions",
}


ARM_NAME_MAX = 64  # longest arm name taken from a response's x-specproxy-arm header


@dataclass(frozen=True, slots=True)
class Target:
    """An OpenAI-compatible base URL; `arm` names a direct arm, None means the proxy decides;
    `control` marks the arm the others are compared with."""

    base_url: str
    arm: str | None = None
    control: bool = False


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
    category_header: str | None = None  # carries each prompt's dataset category, if it has one

    def request_headers(self, prompt: Prompt) -> dict[str, str]:
        headers = {"content-type": "application/json", **dict(self.headers)}
        if self.category_header and prompt.category is not None:
            headers[self.category_header] = prompt.category
        return headers

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
    arm: str | None  # the arm's name; None: through a proxy that did not say
    t_start: float  # Unix time the request was sent
    temperature: float
    measures: Measures
    lateness_ns: int = 0  # open loop: actual send time minus the arrival schedule
    parse_ns: int = 0  # harness time spent scanning the response
    category: str | None = None  # the prompt's dataset category
    # this generator's calls in flight to the request's target when it was sent, itself
    # included (None: through a proxy, which records the arm's own)
    in_flight: int | None = None

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

    def to_record(
        self, *, run_id: str, options: RequestOptions, categories: Categories | None = None
    ) -> RequestRecord:
        """A store row, so that bench runs feed the same statistics and report as the proxy,
        with the conditions the request met (issue 26): the temperature it asked for, its
        dataset category (bounded by `categories` as the proxy bounds its header: None keeps
        none) and, sent straight to an arm, the calls in flight to it."""
        if self.arm is None:
            raise ValueError("a result without an arm cannot be recorded")
        category = categories.of(self.category) if categories is not None else None
        return self.measures.record(
            request_id=uuid.uuid4().hex,
            run_id=run_id,
            arm=Arm(self.arm),
            t_start=self.t_start,
            model=options.model,
            endpoint=options.endpoint,
            stream=options.stream,
            arm_in_flight=self.in_flight,
            endpoint_in_flight=self.in_flight,
            temperature=self.temperature,
            category=category,
        )


def poisson_gaps(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """Exponential inter-arrival gaps (seconds) of a Poisson process with `rate` per second."""
    return arrival_gaps(rate, rng)


def arrival_gaps(rate: float, rng: np.random.Generator, burstiness: float = 1.0) -> Iterator[float]:
    """Inter-arrival gaps (seconds) at `rate` per second, as `vllm bench serve` draws them: gamma
    with shape `burstiness` and scale 1 / (rate * burstiness), so the mean gap is 1 / rate
    whatever the burstiness; 1 is a Poisson process, below 1 burstier, above 1 more regular."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    if burstiness <= 0:
        raise ValueError("burstiness must be > 0")
    while True:
        if burstiness == 1.0:
            yield float(rng.exponential(1.0 / rate))
        else:
            yield float(rng.gamma(burstiness, 1.0 / (rate * burstiness)))


OnResult = Callable[[ClientResult], None]


class _Stream:
    """One target's own sequence of requests: its prompts (the same draws for every target, so
    the arms are paired by position) and its running count."""

    __slots__ = ("prompts", "sent", "slot", "target")

    def __init__(self, target: Target, slot: int, seed: int) -> None:
        self.target = target
        self.slot = slot
        self.prompts = np.random.default_rng(seed)
        self.sent = 0


class LoadGenerator:
    """Sends prompts to one or more targets, each on its own stream, and times every response."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        targets: Sequence[Target],
        prompts: Sequence[Prompt],
        options: RequestOptions,
        *,
        seed: int = 0,
        max_inflight: int = 1024,
        burstiness: float = 1.0,
    ) -> None:
        if not targets:
            raise ValueError("at least one target is needed")
        if not prompts:
            raise ValueError("at least one prompt is needed")
        if burstiness <= 0:
            raise ValueError("burstiness must be > 0")
        self.session = session
        self.targets = tuple(targets)
        self.prompts = tuple(prompts)
        self.options = options
        self.max_inflight = max_inflight  # per target
        self.burstiness = burstiness
        self.skipped = 0  # open-loop arrivals dropped because max_inflight was reached
        self._seed = seed
        self._runs = 0
        self._streams = [_Stream(t, slot, seed) for slot, t in enumerate(self.targets)]
        self._in_flight: dict[str, int] = {}  # calls in flight per target URL

    def _next(self, stream: _Stream) -> tuple[int, Prompt]:
        """The stream's next prompt and a result index unique over all streams; the j-th
        request of every stream carries the same prompt."""
        j = stream.sent
        stream.sent += 1
        prompt = self.prompts[int(stream.prompts.integers(len(self.prompts)))]
        return j * len(self._streams) + stream.slot, prompt

    def _budgets(self, count: int | None) -> list[int | None]:
        """`count` requests in all, split as evenly as the targets allow."""
        n = len(self._streams)
        if count is None:
            return [None] * n
        return [count // n + (1 if i < count % n else 0) for i in range(n)]

    async def send(
        self, index: int, target: Target, prompt: Prompt, *, lateness_ns: int = 0
    ) -> ClientResult:
        """One request, timed from just before sending to the last byte of the response."""
        opts = self.options
        url = target.base_url.rstrip("/") + _PATHS[opts.endpoint]
        body = json.dumps(opts.body(prompt)).encode()
        headers = opts.request_headers(prompt)
        in_flight = self._in_flight[target.base_url] = self._in_flight.get(target.base_url, 0) + 1
        try:
            return await self._send(
                index, target, prompt, url, body, headers, lateness_ns, in_flight
            )
        finally:
            self._in_flight[target.base_url] -= 1

    async def _send(
        self,
        index: int,
        target: Target,
        prompt: Prompt,
        url: str,
        body: bytes,
        headers: dict[str, str],
        lateness_ns: int,
        in_flight: int,
    ) -> ClientResult:
        opts = self.options
        t_start = time.time()
        t0 = time.perf_counter()
        timings = RequestTimings(request_start=t0, upstream_start=t0)
        arm = target.arm
        parse_ns = 0
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                timings.status = resp.status
                served_by = resp.headers.get(ARM_HEADER)
                if arm is None and served_by and len(served_by) <= ARM_NAME_MAX:
                    arm = served_by
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
            category=prompt.category,
            in_flight=in_flight if target.arm is not None else None,
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
        """Arrivals at `rate`/s on each target (Poisson, or gamma with `burstiness`) until
        `count` requests in all, `duration_s` or `stop`; every target gets the same schedule."""
        _check_bounds(count, duration_s, stop)
        if rate <= 0:
            raise ValueError("rate must be > 0")
        results: list[ClientResult] = []
        self._runs += 1
        schedule_seed = (self._seed, self._runs)
        loop = asyncio.get_running_loop()
        start = loop.time()

        def done(task: asyncio.Task[ClientResult]) -> None:
            if not task.cancelled() and task.exception() is None:
                result = task.result()
                results.append(result)
                if on_result is not None:
                    on_result(result)

        async def arrivals(stream: _Stream, budget: int | None) -> None:
            inflight: set[asyncio.Task[ClientResult]] = set()
            rng = np.random.default_rng(schedule_seed)
            due = start
            sent = 0
            for gap in arrival_gaps(rate, rng, self.burstiness):
                due += gap
                if budget is not None and sent >= budget:
                    break
                if duration_s is not None and due - start >= duration_s:
                    break
                if await _sleep_or_stop(due - loop.time(), stop):
                    break
                if len(inflight) >= self.max_inflight:
                    self.skipped += 1
                    continue
                index, prompt = self._next(stream)
                lateness = max(0, round((loop.time() - due) * 1e9))
                task = asyncio.create_task(
                    self.send(index, stream.target, prompt, lateness_ns=lateness)
                )
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                task.add_done_callback(done)
                sent += 1
            await _drain(inflight, drain_timeout_s)

        budgets = self._budgets(count)
        await asyncio.gather(*(arrivals(s, b) for s, b in zip(self._streams, budgets, strict=True)))
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
        """`concurrency` clients per target, back to back, until `count` requests in all,
        `duration_s` or `stop`. Each target's clients are its own pool: they send only to it."""
        _check_bounds(count, duration_s, stop)
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        results: list[ClientResult] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + duration_s if duration_s is not None else None

        def claim(budget: list[int | None]) -> bool:
            if stop is not None and stop.is_set():
                return False
            if deadline is not None and loop.time() >= deadline:
                return False
            left = budget[0]
            if left is not None:
                if left <= 0:
                    return False
                budget[0] = left - 1
            return True

        async def client(stream: _Stream, budget: list[int | None]) -> None:
            while claim(budget):
                index, prompt = self._next(stream)
                result = await self.send(index, stream.target, prompt)
                results.append(result)
                if on_result is not None:
                    on_result(result)

        pools = []
        for stream, budget in zip(self._streams, self._budgets(count), strict=True):
            shared = [budget]  # one budget per target, shared by that target's clients
            pools += [client(stream, shared) for _ in range(concurrency)]
        await asyncio.gather(*pools)
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
