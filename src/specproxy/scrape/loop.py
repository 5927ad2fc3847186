"""The periodic scrape of each arm's vLLM /metrics, and the latest state per arm.

An arm is a pool of engine endpoints (`fleet`): each round scrapes every endpoint, and
`aggregate` keeps deltas and restarts per endpoint and sums them into the arm's sample. Each
endpoint's scrape is also the health probe that readmits it to the pool after an ejection. An arm
whose endpoints are a gateway (LiteLLM, a router) names its engines by `metrics_urls` or
`metrics_dns`: those are scraped instead, and the gateway's ejected endpoints get a probe of
their own (`_probe_gateways`). Each
each round reads the served models (`/v1/models`) of one endpoint per arm for the bounded
`model` label.

Every `scrape.interval_s` all endpoints are scraped concurrently on the proxy's own per-arm
`ClientSession` (no extra connection pools), each GET bounded by `scrape.timeout_s`. Whatever
goes wrong (refused, timeout, HTTP error, garbage body) marks the arm down (`up=0`) and is logged
once when the state changes; the loop itself never stops until it is closed. Every scrape, up or
down, is handed to the recorder as an `EngineSample`, so the store holds the engine's history
next to the requests it served. Parsing runs in a worker thread: a page with many data-parallel
engines takes milliseconds to parse (benchmarks/bench_scrape.py), time the proxy's event loop
owes to the requests it is streaming.

Scraping is bounded in what it costs the proxy, not only in bytes. A worker thread still holds
the GIL while it parses, so a huge page slows every stream (a 13.6 MB page every 5 s took a core
and the clients' p50 from 7 to 55 ms). A page is refused above `MAX_BODY_BYTES` (4 MiB: a real
vLLM page is ~55 kB per engine, so ~70 engines in one page), and the parsing CPU of each round
(`time.thread_time` in the worker) sets the wait before the next one: at most `CPU_SHARE` (5 %)
of one core goes to parsing (`next_wait`); the stretch is logged when it starts and ends.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

import aiohttp

from specproxy.config import Config
from specproxy.errors import ScrapeError
from specproxy.fleet.arms import Fleet
from specproxy.fleet.models import parse_models
from specproxy.records import Arm, EngineSample, Recorder
from specproxy.scrape.aggregate import ArmAggregate, EndpointState
from specproxy.scrape.parse import EngineSnapshot, parse_metrics
from specproxy.tasks import cancel_and_wait

__all__ = [
    "BALANCED_WARNING",
    "CPU_SHARE",
    "MAX_BODY_BYTES",
    "ArmState",
    "EngineScraper",
    "describe_error",
    "fetch_text",
    "next_wait",
]

logger = logging.getLogger("specproxy.scrape")

MAX_BODY_BYTES: Final = 4 * 1024 * 1024  # a real vLLM page is ~55 kB per engine
CPU_SHARE: Final = 0.05  # of one core, the most the scrape rounds' parsing may take


def next_wait(interval_s: float, parse_cpu_s: float, share: float = CPU_SHARE) -> float:
    """Seconds from one round's start to the next: `interval_s`, stretched so that the round's
    parsing CPU is at most `share` of the time (a 0.5 s parse at 5 %: 10 s)."""
    return max(interval_s, parse_cpu_s / share)


def _parse_timed(text: str, t: float) -> tuple[EngineSnapshot | ScrapeError, float]:
    """`parse_metrics` (or why the text is no vLLM page) and the CPU time it took in this
    (worker) thread: a page that fails to parse costs as much as one that parses."""
    start = time.thread_time()
    try:
        result: EngineSnapshot | ScrapeError = parse_metrics(text, t=t)
    except ScrapeError as exc:
        result = exc
    return result, time.thread_time() - start


# Logged once per URL (`aggregate.ArmAggregate.newly_balanced`), with the arm and the URL.
BALANCED_WARNING = (
    "engine %s: %s answers from more than one engine process (a load-balanced address, such as"
    " a ClusterIP Service): its changes of process are not counted as restarts, and its gauges"
    ' describe one engine at a time. Scrape every engine: set dns = "<headless Service>" in'
    " this arm's table (a Service with clusterIP: None), or metrics_urls / metrics_dns when the"
    " traffic goes through a gateway"
)


@dataclass(slots=True)
class ArmState:
    """What the scraper currently knows about one arm (read by the collector)."""

    arm: Arm
    up: bool | None = None  # None until the first scrape finished
    error: str | None = None  # why the last scrape failed
    snapshot: EngineSnapshot | None = None  # the last good scrape
    sample: EngineSample | None = None  # the last sample derived from a good scrape
    # Speculative figures of the last interval that had drafts: held through idle intervals
    # (which have no rate), cleared when the engine stops exposing speculative metrics.
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    position_acceptance: tuple[float, ...] | None = None
    restart_times: list[float] = field(default_factory=list)
    first_failed: float | None = None  # first failed scrape since the last good one
    endpoints: Mapping[str, EndpointState] = field(default_factory=dict)  # by base URL

    @property
    def restarts(self) -> int:
        return len(self.restart_times)


class EngineScraper:
    """Scrapes both arms periodically; `start()` / `close()` bracket the app's life."""

    def __init__(
        self,
        config: Config,
        sessions: Mapping[Arm, aiohttp.ClientSession],
        recorder: Recorder | None = None,
        *,
        clock: Callable[[], float] = time.time,
        fleet: Fleet | None = None,
    ) -> None:
        self._config = config
        self._sessions = sessions
        self._recorder = recorder
        self._clock = clock
        self._fleet = fleet if fleet is not None else Fleet(config)
        arms = self._fleet.arms
        self._aggregates = {arm: ArmAggregate(arm, config.run_id) for arm in arms}
        self._states = {
            arm: ArmState(arm, endpoints=self._aggregates[arm].endpoints) for arm in arms
        }
        self._task: asyncio.Task[None] | None = None
        self._round_cpu_s = 0.0  # parsing CPU of the round in progress
        self.wait_s = config.scrape.interval_s  # the wait the last round set (`next_wait`)

    @property
    def states(self) -> Mapping[Arm, ArmState]:
        return self._states

    def restart_times(self, arm: Arm) -> tuple[float, ...]:
        """When the arm's engine restarted (Unix times): each one opens a warm-up window."""
        return tuple(self._states[arm].restart_times)

    def engine_load(self, arm: Arm, url: str) -> tuple[float | None, float | None]:
        """(running, waiting) requests of one endpoint at its latest scrape, (None, None) while
        it is unknown or its last scrape failed: read on the request path, so no I/O."""
        state = self._aggregates[arm].endpoints.get(url)
        sample = state.sample if state is not None and state.up else None
        if sample is None:
            return None, None
        return sample.requests_running, sample.requests_waiting

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="specproxy-engine-scraper")

    async def close(self) -> None:
        task, self._task = self._task, None
        await cancel_and_wait(task)

    async def scrape_once(self) -> dict[Arm, EngineSample]:
        """Scrape every arm once, concurrently; never raises (except on cancellation)."""
        samples = await asyncio.gather(*(self._scrape_arm(arm) for arm in self._states))
        await self._refresh_models()
        return dict(zip(self._states, samples, strict=True))

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self._config.scrape.interval_s
        next_at = loop.time()
        while True:
            self._round_cpu_s = 0.0
            await self.scrape_once()
            self._set_wait(next_wait(interval, self._round_cpu_s), interval)
            # Fixed-rate schedule: a slow scrape does not push every later one back.
            next_at = max(next_at + self.wait_s, loop.time())
            await asyncio.sleep(next_at - loop.time())

    def _set_wait(self, wait_s: float, interval_s: float) -> None:
        stretched, was = wait_s > interval_s, self.wait_s > interval_s
        if stretched and not was:
            logger.warning(
                "scrape: parsing the engines' /metrics took %.2f s of CPU: scraping every %.1f s"
                " instead of %g s, so it takes at most %d%% of a core from the requests",
                self._round_cpu_s,
                wait_s,
                interval_s,
                round(CPU_SHARE * 100),
            )
        elif was and not stretched:
            logger.info("scrape: back to every %g s", interval_s)
        self.wait_s = wait_s

    async def _scrape_arm(self, arm: Arm) -> EngineSample:
        state = self._states[arm]
        pool = self._fleet.pool(arm)
        urls = self._fleet.metrics_targets(arm)
        t = self._clock()
        results = await asyncio.gather(*(self._scrape_endpoint(arm, url, t) for url in urls))
        by_url = dict(zip(urls, results, strict=True))
        if self._fleet.scrapes_endpoints(arm):
            for url, result in by_url.items():
                pool.probe(url, ok=not isinstance(result, str))
        else:
            await self._probe_gateways(arm)
        if not urls:
            return self._mark_down(state, t, "no engine to scrape yet (metrics_dns unresolved)")
        aggregate = self._aggregates[arm]
        known_restarts = len(aggregate.restart_times)
        sample = aggregate.update(t, by_url)
        for url in aggregate.newly_balanced:
            logger.warning(BALANCED_WARNING, arm, url)
        if not sample.up:
            reasons = sorted({r for r in results if isinstance(r, str)})
            return self._mark_down(state, t, "; ".join(reasons))
        snapshot = next(r for r in results if not isinstance(r, str))
        return self._mark_up(state, snapshot, sample, aggregate.restart_times[known_restarts:])

    async def _scrape_endpoint(self, arm: Arm, url: str, t: float) -> EngineSnapshot | str:
        """The endpoint's snapshot, or why it could not be read."""
        try:
            text = await self._fetch(arm, url + "/metrics")
            result, cpu_s = await asyncio.to_thread(_parse_timed, text, t)
            self._round_cpu_s += cpu_s
            if isinstance(result, ScrapeError):
                raise result
            return result
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the loop must survive anything a remote server sends
            return describe_error(exc)

    async def _probe_gateways(self, arm: Arm) -> None:
        """Probe the ejected endpoints of an arm scraped elsewhere (a gateway in front of its
        engines) that are due: any HTTP answer below 500 to GET /v1/models readmits one (a 401
        is a gateway that is up and wants a key the probe does not send)."""
        pool = self._fleet.pool(arm)
        for endpoint in pool.due_for_probe():
            timeout = aiohttp.ClientTimeout(total=self._config.scrape.timeout_s)
            try:
                async with self._sessions[arm].get(
                    endpoint.url + "/v1/models", timeout=timeout
                ) as resp:
                    ok = resp.status < 500
            except asyncio.CancelledError:
                raise
            except Exception:  # refused, timed out, garbage: still down
                ok = False
            pool.probe(endpoint.url, ok=ok)

    async def _refresh_models(self) -> None:
        """The models the arms serve, from one up endpoint each, for the bounded label."""
        served: list[str] = []
        for arm, state in self._states.items():
            url = next((u for u, ep in state.endpoints.items() if ep.up), None)
            if url is None:  # no engine answers /metrics: nothing to ask
                continue
            try:
                served += parse_models(await self._fetch(arm, url + "/v1/models"))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a missing /v1/models only leaves the label set as is
                logger.debug("engine %s: /v1/models unreadable: %s", arm, describe_error(exc))
                return
        if served:
            self._fleet.labels.set_served(served)

    async def _fetch(self, arm: Arm, url: str) -> str:
        return await fetch_text(self._sessions[arm], url, timeout_s=self._config.scrape.timeout_s)

    def _mark_down(self, state: ArmState, t: float, reason: str) -> EngineSample:
        if state.up is not False:
            logger.warning("engine %s: /metrics scrape failed, marking down: %s", state.arm, reason)
        state.up, state.error = False, reason
        if state.first_failed is None:
            state.first_failed = t
        sample = EngineSample(t=t, run_id=self._config.run_id, arm=state.arm, up=False)
        self._record(sample)
        return sample

    def _mark_up(
        self,
        state: ArmState,
        snapshot: EngineSnapshot,
        sample: EngineSample,
        restarts: list[float],
    ) -> EngineSample:
        for when in restarts:
            state.restart_times.append(when)
            warmup = self._config.warmup
            logger.warning(
                "engine %s restarted (restart %d); excluding the next %d requests / %.0f s",
                state.arm,
                state.restarts,
                warmup.restart_requests,
                warmup.restart_seconds,
            )
        if state.up is not True:
            spec = snapshot.spec_format.value if snapshot.spec_format else "no"
            logger.info(
                "engine %s: /metrics is up (%s speculative metrics, %d engine(s))",
                state.arm,
                spec,
                snapshot.engines,
            )
        state.up, state.error, state.snapshot, state.sample = True, None, snapshot, sample
        state.first_failed = None
        if snapshot.spec_format is None:
            state.acceptance_rate = state.mean_acceptance_length = None
            state.position_acceptance = None
        else:
            if sample.acceptance_rate is not None:
                state.acceptance_rate = sample.acceptance_rate
            if sample.mean_acceptance_length is not None:
                state.mean_acceptance_length = sample.mean_acceptance_length
            if sample.position_acceptance is not None:
                state.position_acceptance = sample.position_acceptance
        self._record(sample)
        return sample

    def _record(self, sample: EngineSample) -> None:
        if self._recorder is None:
            return
        try:
            self._recorder.record_engine(sample)
        except Exception:  # the contract says it never raises; the loop must not trust that
            logger.exception("engine %s: recording the engine sample failed", sample.arm)


async def fetch_text(session: aiohttp.ClientSession, url: str, *, timeout_s: float) -> str:
    """GET `url`: its body as text, bounded by `MAX_BODY_BYTES` and `timeout_s`; any HTTP status
    but 200, an oversized or non-UTF-8 body is a `ScrapeError`."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with session.get(url, timeout=timeout) as resp:
        if resp.status != 200:
            raise ScrapeError(f"HTTP {resp.status} from {url}")
        body = bytearray()
        async for chunk in resp.content.iter_any():
            body += chunk
            if len(body) > MAX_BODY_BYTES:
                raise ScrapeError(f"body of {url} exceeds {MAX_BODY_BYTES} bytes")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ScrapeError(f"body of {url} is not UTF-8") from exc


def describe_error(exc: BaseException) -> str:
    """A scrape failure in a few words (for logs and the `error` of a state)."""
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ScrapeError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
