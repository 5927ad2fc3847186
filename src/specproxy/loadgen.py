"""The load generator shared by `specproxy demo` and `specproxy bench`.

Two arrival models, because they answer different questions:

- open loop (`run_open_loop`): Poisson arrivals at a fixed rate, whatever the server does, like
  independent users. Latency under load and queueing show up honestly; a slow server does not
  slow the arrivals down (coordinated omission). Each result keeps its *lateness* (actual send
  time minus scheduled time), which shows whether the harness itself kept up.
- closed loop (`run_closed_loop`): a fixed number of clients, each sending its next request when
  the previous one finished; the classic benchmark for a given concurrency.

Every request is timed with `time.perf_counter_ns` from just before the request is sent to the
last byte of the response; the time the harness spends parsing SSE events is measured too
(`parse_ns`), so its overhead can be compared with the latencies it reports.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import numpy as np

from specproxy.prompts import Prompt
from specproxy.records import Arm, RequestRecord

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
        return body


@dataclass(frozen=True, slots=True)
class ClientResult:
    """One request as the client saw it. Durations are nanoseconds of `perf_counter_ns`."""

    index: int
    arm: Arm | None
    t_start: float  # Unix time the request was sent
    status: int
    e2e_ns: int
    temperature: float
    ttft_ns: int | None = None
    n_events: int = 0
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    mean_gap_ns: float | None = None
    max_gap_ns: int | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    lateness_ns: int = 0  # open loop: actual send time minus the Poisson schedule
    parse_ns: int = 0  # harness time spent parsing the response
    error_kind: str | None = None

    @property
    def ok(self) -> bool:
        return self.error_kind is None and 200 <= self.status < 300

    def to_record(self, *, run_id: str, options: RequestOptions) -> RequestRecord:
        """A store row, so that bench runs feed the same statistics and report as the proxy."""
        if self.arm is None:
            raise ValueError("a result without an arm cannot be recorded")
        e2e = self.e2e_ns / 1e9
        ttft = self.ttft_ns / 1e9 if self.ttft_ns is not None else None
        tpot = None
        if ttft is not None and self.output_tokens is not None and self.output_tokens > 1:
            tpot = (e2e - ttft) / (self.output_tokens - 1)
        per_event = None
        if self.output_tokens and self.n_events:
            per_event = self.output_tokens / self.n_events
        return RequestRecord(
            request_id=uuid.uuid4().hex,
            run_id=run_id,
            arm=self.arm,
            t_start=self.t_start,
            model=options.model,
            endpoint=options.endpoint,
            stream=options.stream,
            status=self.status,
            e2e_s=e2e,
            upstream_s=e2e,  # no proxy in between: the client's time is the upstream's time
            ttft_s=ttft,
            tpot_s=tpot,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            n_events=self.n_events,
            tokens_per_event=per_event,
            mean_gap_s=self.mean_gap_ns / 1e9 if self.mean_gap_ns is not None else None,
            max_gap_s=self.max_gap_ns / 1e9 if self.max_gap_ns is not None else None,
            acceptance_rate=self.acceptance_rate,
            mean_acceptance_length=self.mean_acceptance_length,
            error_kind=self.error_kind,
        )


def poisson_gaps(rate: float, rng: np.random.Generator) -> Iterator[float]:
    """Exponential inter-arrival gaps (seconds) of a Poisson process with `rate` per second."""
    if rate <= 0:
        raise ValueError("rate must be > 0")
    while True:
        yield float(rng.exponential(1.0 / rate))


@dataclass(slots=True)
class _ResponseStats:
    """Accumulates what one response tells us while it streams in."""

    t0_ns: int
    status: int = 0
    ttft_ns: int | None = None
    n_events: int = 0
    last_event_ns: int | None = None
    gaps: list[int] = field(default_factory=list)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    parse_ns: int = 0

    def observe(self, payload: dict[str, Any], now_ns: int) -> None:
        if _has_content(payload):
            if self.ttft_ns is None:
                self.ttft_ns = now_ns - self.t0_ns
            if self.last_event_ns is not None:
                self.gaps.append(now_ns - self.last_event_ns)
            self.last_event_ns = now_ns
            self.n_events += 1
        usage = payload.get("usage")
        if isinstance(usage, dict):
            self.prompt_tokens = _int_or_none(usage.get("prompt_tokens"))
            self.output_tokens = _int_or_none(usage.get("completion_tokens"))
        metrics = payload.get("metrics")
        spec = metrics.get("speculative_decoding") if isinstance(metrics, dict) else None
        if isinstance(spec, dict):
            self.acceptance_rate = _float_or_none(spec.get("draft_acceptance_rate"))
            self.mean_acceptance_length = _float_or_none(spec.get("mean_acceptance_length"))


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

    def _next(self) -> tuple[int, Target, Prompt]:
        index = self._index
        self._index += 1
        target = self.targets[int(self._rng.integers(len(self.targets)))]
        prompt = self.prompts[int(self._rng.integers(len(self.prompts)))]
        return index, target, prompt

    async def send(
        self, index: int, target: Target, prompt: Prompt, *, lateness_ns: int = 0
    ) -> ClientResult:
        """One request, timed from just before sending to the last byte of the response."""
        opts = self.options
        url = target.base_url.rstrip("/") + _PATHS[opts.endpoint]
        body = json.dumps(opts.body(prompt)).encode()
        headers = {"content-type": "application/json", **dict(opts.headers)}
        t_start = time.time()
        t0 = time.perf_counter_ns()
        acc = _ResponseStats(t0_ns=t0)
        arm = target.arm
        error: str | None = None
        try:
            async with self.session.post(url, data=body, headers=headers) as resp:
                acc.status = resp.status
                served_by = resp.headers.get(ARM_HEADER)
                if arm is None and served_by in (Arm.SPECULATIVE.value, Arm.BASELINE.value):
                    arm = Arm(served_by)
                if resp.status >= 400:
                    await resp.read()
                    error = "http_4xx" if resp.status < 500 else "http_5xx"
                elif opts.stream:
                    await _read_sse(resp, acc)
                else:
                    raw = await resp.read()
                    now = time.perf_counter_ns()
                    payload = json.loads(raw)
                    if isinstance(payload, dict):
                        acc.observe(payload, now)
                    acc.parse_ns += time.perf_counter_ns() - now
        except (aiohttp.ClientConnectorError, ConnectionRefusedError):
            error = "connect"
        except TimeoutError:
            error = "timeout"
        except (aiohttp.ClientError, json.JSONDecodeError, UnicodeDecodeError):
            error = "broken"
        e2e = time.perf_counter_ns() - t0
        gaps = acc.gaps
        return ClientResult(
            index=index,
            arm=arm,
            t_start=t_start,
            status=acc.status,
            e2e_ns=e2e,
            temperature=opts.temperature,
            ttft_ns=acc.ttft_ns if opts.stream else None,
            n_events=acc.n_events,
            prompt_tokens=acc.prompt_tokens,
            output_tokens=acc.output_tokens,
            mean_gap_ns=sum(gaps) / len(gaps) if gaps else None,
            max_gap_ns=max(gaps) if gaps else None,
            acceptance_rate=acc.acceptance_rate,
            mean_acceptance_length=acc.mean_acceptance_length,
            lateness_ns=lateness_ns,
            parse_ns=acc.parse_ns,
            error_kind=error,
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


async def _read_sse(resp: aiohttp.ClientResponse, acc: _ResponseStats) -> None:
    """Read `data:` lines as they arrive; every event is timed when its line is complete."""
    async for line in resp.content:
        now = time.perf_counter_ns()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            continue
        payload = json.loads(data)
        if isinstance(payload, dict):
            acc.observe(payload, now)
        acc.parse_ns += time.perf_counter_ns() - now


def _has_content(payload: dict[str, Any]) -> bool:
    choices = payload.get("choices")
    if not isinstance(choices, list):
        return False
    for choice in choices:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and delta.get("content"):
            return True
        if choice.get("text"):
            return True
    return False


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float_or_none(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


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
