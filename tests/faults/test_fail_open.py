"""A treatment arm dies under load and comes back: the proxy fails open (issue 25).

The real proxy app (SQLite store, scraper, fleet with an injected clock) in front of emulator arms:
one baseline, two speculative endpoints. Under load, one speculative endpoint is killed (its
listening socket closed and every connection aborted, as a crashed process leaves them), then the
other. What is guaranteed, and asserted:

- a request started after a kill gets a complete 200 (no error caused by the experiment): the
  arm's other endpoint serves it, or, with none left, the control (`x-specproxy-arm: baseline`);
- a request in flight on an endpoint when it dies cannot be saved without sending it twice: it
  may fail, and it is then recorded with its error and never rerouted;
- every request has exactly one primary record; the rerouted ones carry `rerouted_from` and a
  reason (`connect` before the pool ejected every endpoint, `down` after), are counted in
  `specproxy_rerouted_requests_total`, and are neither in the rows the stats job reads
  (`usable_only`) nor in the rollups; a rerouted request is in no mirrored pair;
- nothing is sent twice, from what each engine read: a request reached the arm that answered
  it once (no retry on another endpoint of a treatment after sending), and a rerouted one never
  reached the treatment; `x-specproxy-arm` is the arm of the request's record;
- `/readyz` stays 200 and names the treatment under `degraded`; `specproxy_arm_up` goes to 0;
- when the engines come back, the treatment stays out of rotation until a probe (the scraper's
  /metrics scrape, called here explicitly, after the injected clock passed the ejection time)
  readmits each endpoint; then it takes traffic again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient, AiohttpServer

from specproxy.app import create_app
from specproxy.appkeys import FLEET, SCRAPER, STORE
from specproxy.config import (
    ArmConfig,
    Config,
    OutlierConfig,
    RoutingConfig,
    ScrapeConfig,
    StoreConfig,
)
from specproxy.emulator import EmulatorConfig
from specproxy.emulator.server import create_emulator_app
from specproxy.fleet.arms import Fleet
from specproxy.fleet.pool import EndpointPool
from specproxy.metrics import ARM_UP, REROUTED
from specproxy.records import RECORD_FIELDS
from tests.faults.conftest import fault_row, rss_bytes
from tests.store.helpers import read_arrays, read_rollups

pytestmark = pytest.mark.timeout(180)

RUN = "fail-open"
CHAT = "/v1/chat/completions"
WORKERS = 6  # concurrent clients
PER_PHASE = 36  # requests completed per phase before the next step
EJECT_AFTER = 2
MAX_EJECTION_S = 60.0
ENGINE = EmulatorConfig(
    time_scale=0.1, warmup_requests=0, base_step_s=0.01, default_output_tokens=8, seed=1
)
SPECULATIVE_ENGINE = dataclasses.replace(ENGINE, speculative=True)


class Clock:
    """The fleet's clock: ejection times pass only when the test says so."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Engine:
    """One emulated engine that can be killed like a crashed process and started again on the
    same port (so its URL in the proxy's config stays right). `received` logs the text of every
    completion request it read, shadows included: what the proxy really sent it."""

    def __init__(self, cfg: EmulatorConfig) -> None:
        self.cfg = cfg
        self.port = 0
        self.runner: web.AppRunner | None = None
        self.site: web.TCPSite | None = None
        self.received: list[str] = []

    @web.middleware
    async def _log(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == CHAT:
            doc = await request.json()  # read once; aiohttp keeps the body for the handler
            self.received.append(doc["messages"][0]["content"])
        return await handler(request)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        app = create_emulator_app(self.cfg)
        app.middlewares.append(self._log)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", self.port)
        await site.start()
        self.runner, self.site = runner, site
        self.port = runner.addresses[0][1]

    async def kill(self) -> None:
        """No more connections, every open one reset: what a SIGKILL leaves the clients."""
        runner, site = self.runner, self.site
        assert runner is not None and site is not None and runner.server is not None
        await site.stop()  # closes the listening socket (no await inside: nothing slips in)
        for handler in runner.server.connections:
            if handler.transport is not None:
                handler.transport.abort()
        self.runner = self.site = None
        await runner.cleanup()


@dataclass
class Sent:
    """One client request as the client saw it."""

    phase: str  # the phase when it started
    status: int
    complete: bool  # the whole body arrived
    arm: str  # x-specproxy-arm
    request_id: str
    text: str  # the message, unique per request: how the engines' logs name it


@dataclass
class Load:
    """`WORKERS` clients sending requests back to back, every one logged with its phase."""

    client: TestClient[web.Request, None]
    phase: str = "healthy"
    sent: list[Sent] = field(default_factory=list)
    stop: bool = False
    progress: asyncio.Event = field(default_factory=asyncio.Event)
    started: int = 0

    async def one(self, i: int) -> None:
        phase = self.phase
        self.started += 1
        text = f"request {self.started}"
        body: dict[str, Any] = {
            "model": "tiny-llama",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": 8,
            "stream": i % 2 == 0,
        }
        async with self.client.post(CHAT, json=body) as resp:
            try:
                await resp.read()
                complete = True
            except aiohttp.ClientPayloadError:
                complete = False
            arm = resp.headers.get("x-specproxy-arm", "")
            request_id = resp.headers.get("x-specproxy-request-id", "")
            self.sent.append(Sent(phase, resp.status, complete, arm, request_id, text))
        self.progress.set()

    async def worker(self, w: int) -> None:
        i = w
        while not self.stop:
            await self.one(i)
            i += WORKERS

    async def until(self, n: int) -> None:
        """Until `n` requests of the current phase finished."""
        while sum(s.phase == self.phase for s in self.sent) < n:
            self.progress.clear()
            await self.progress.wait()


async def _loop_turns(n: int = 20) -> None:
    """Let the event loop run `n` rounds: the proxy sees the resets of the killed engine's
    connections (a request written into one before that is the in-flight race above)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def _readyz(client: TestClient[web.Request, None]) -> tuple[int, dict[str, Any]]:
    async with client.get("/readyz") as resp:
        return resp.status, await resp.json()


def _down(pool: EndpointPool) -> bool:
    """`pool.down` (a call, so that mypy does not narrow the property)."""
    return pool.down


def _sample(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float:
    return sum(
        s.value
        for metric in registry.collect()
        for s in metric.samples
        if s.name == name and labels.items() <= s.labels.items()
    )


@pytest.fixture
async def engines() -> AsyncIterator[dict[str, Engine]]:
    made = {
        "baseline": Engine(ENGINE),
        "s1": Engine(SPECULATIVE_ENGINE),
        "s2": Engine(SPECULATIVE_ENGINE),
    }
    for engine in made.values():
        await engine.start()
    yield made
    for engine in made.values():
        if engine.runner is not None:
            with contextlib.suppress(Exception):
                await engine.kill()


async def test_a_treatment_arm_killed_under_load_fails_open_and_comes_back(
    engines: dict[str, Engine],
    tmp_path: Path,
    aiohttp_server: AiohttpServer,
    aiohttp_client: AiohttpClient,
) -> None:
    cfg = Config(
        baseline_url=engines["baseline"].url,
        speculative=ArmConfig(urls=(engines["s1"].url, engines["s2"].url)),  # on_down: control
        run_id=RUN,
        routing=RoutingConfig(speculative_share=0.5, mirror_fraction=0.25, seed=3),
        outlier=OutlierConfig(
            eject_after_failures=EJECT_AFTER, base_ejection_s=30.0, max_ejection_s=MAX_EJECTION_S
        ),
        scrape=ScrapeConfig(interval_s=3600.0),  # one scrape at start; the test probes itself
        store=StoreConfig(
            url=f"sqlite:///{tmp_path}/store.db", spill_path=str(tmp_path / "spill.jsonl")
        ),
    )
    registry = CollectorRegistry()
    app = create_app(cfg, registry=registry, with_stats=False)
    clock = Clock()
    app[FLEET] = Fleet(cfg, clock=clock)
    client: TestClient[web.Request, None] = await aiohttp_client(await aiohttp_server(app))
    rss_before = rss_bytes()
    pool = app[FLEET].pool("speculative")
    up = {"arm": "speculative"}

    load = Load(client)
    workers = [asyncio.create_task(load.worker(w)) for w in range(WORKERS)]
    try:
        await load.until(PER_PHASE)
        await engines["s2"].kill()  # one speculative endpoint of two
        await _loop_turns()
        load.phase = "one_down"
        await load.until(PER_PHASE)
        assert await _readyz(client) == (
            200,
            {"ready": True, "arms": {"speculative": True, "baseline": True}, "degraded": []},
        )
        await engines["s1"].kill()  # every one of them
        await _loop_turns()
        load.phase = "all_down"
        await load.until(PER_PHASE)
        assert pool.down  # the pool ejected both: the arm is down, requests skip it
        await load.until(2 * PER_PHASE)
    finally:
        load.stop = True
        await asyncio.gather(*workers)

    status, ready = await _readyz(client)
    assert status == 200 and ready["degraded"] == ["speculative"]
    assert ready["arms"] == {"speculative": False, "baseline": True}
    assert _sample(registry, ARM_UP, up) == 0

    # Requests started after the last kill: a complete 200 each, from the control. (Those of
    # one_down may have been in flight on s1 when it died: checked with the records below.)
    after = [s for s in load.sent if s.phase != "healthy"]
    assert [s for s in after if s.phase != "one_down" and (s.status != 200 or not s.complete)] == []
    all_down = [s for s in load.sent if s.phase == "all_down"]
    assert {s.arm for s in all_down} == {"baseline"}  # the control answered every one

    # The engines come back; the treatment stays out until a probe after its ejection time.
    for name in ("s1", "s2"):
        await engines[name].start()
    await app[SCRAPER].scrape_once()  # too early: the ejections are not over
    assert pool.down
    load.phase = "back_unprobed"
    await asyncio.gather(*(load.one(i) for i in range(8)))
    assert {s.arm for s in load.sent if s.phase == "back_unprobed"} == {"baseline"}
    assert (await _readyz(client))[1]["degraded"] == ["speculative"]  # up, but not readmitted
    clock.now += MAX_EJECTION_S
    await app[SCRAPER].scrape_once()  # the probe readmits every endpoint
    assert not _down(pool) and not any(ep.ejected for ep in pool.endpoints)
    assert _sample(registry, ARM_UP, up) == 1
    load.phase = "back"
    await asyncio.gather(*(load.one(i) for i in range(16)))
    back = [s for s in load.sent if s.phase == "back"]
    assert all(s.status == 200 and s.complete for s in back)
    assert {s.arm for s in back} == {"speculative", "baseline"}  # the treatment serves again
    assert (await _readyz(client))[1]["degraded"] == []

    # The records: one primary per request, rerouted ones flagged, counted, and kept out.
    store = app[STORE]
    await store.flush()
    arrays = await read_arrays(store, run_id=RUN, columns=RECORD_FIELDS)
    rows = [
        dict(zip(RECORD_FIELDS, values, strict=True))
        for a in arrays.values()
        for values in zip(*(a[f] for f in RECORD_FIELDS), strict=True)
    ]
    primaries = {r["request_id"]: r for r in rows if not r["shadow"]}
    assert len(primaries) == len([r for r in rows if not r["shadow"]]) == len(load.sent)
    assert set(primaries) == {s.request_id for s in load.sent}
    rerouted = [r for r in primaries.values() if r["rerouted_from"] is not None]
    assert rerouted and all(
        r["rerouted_from"] == "speculative"
        and r["arm"] == "baseline"
        and r["status"] == 200
        and r["error_kind"] is None
        and r["pair_id"] is None  # no pair with its own shadow
        for r in rerouted
    )
    reasons = {
        reason: sum(r["reroute_reason"] == reason for r in rerouted)
        for reason in ("connect", "down")
    }
    assert reasons["down"] > 0 and reasons["connect"] + reasons["down"] == len(rerouted)
    for reason, n in reasons.items():
        labels = {"from": "speculative", "to": "baseline", "reason": reason}
        assert _sample(registry, REROUTED + "_total", labels) == n
    # A request in flight on an engine when it died may have failed: recorded with its error,
    # never rerouted (it was sent), and only on an engine killed after the request started.
    failed = [r for r in primaries.values() if r["error_kind"] is not None]
    assert all(r["rerouted_from"] is None and r["arm"] == "speculative" for r in failed)
    phase = {s.request_id: s.phase for s in load.sent}
    killed_later = {
        "healthy": {engines["s1"].url, engines["s2"].url},
        "one_down": {engines["s1"].url},
    }
    for r in failed:
        assert r["engine_url"] in killed_later.get(phase[r["request_id"]], set()), r
    failed_ids = {r["request_id"] for r in failed}
    assert {s.request_id for s in after if s.status != 200 or not s.complete} <= failed_ids
    # No mirrored pair has both members on one arm.
    pairs: dict[str, list[str]] = {}
    for r in rows:
        if r["pair_id"] is not None:
            pairs.setdefault(r["pair_id"], []).append(r["arm"])
    assert all(len(arms) == len(set(arms)) <= 2 for arms in pairs.values())

    # x-specproxy-arm names the arm that answered: the record's, request by request.
    assert all(s.arm == primaries[s.request_id]["arm"] for s in load.sent if s.arm)
    # Never sent twice, from what the engines read: a request reached the arm that answered it
    # once (no retry on the arm's other endpoint either) and its shadow's arm once, nothing
    # else; a rerouted one never reached the treatment. (A request mirrored to the control and
    # then rerouted there, before the pool knew the arm was down, reaches the control twice: as
    # its shadow, sent first, and as the primary that could not be sent to the treatment.)
    arm_of = {"baseline": "baseline", "s1": "speculative", "s2": "speculative"}
    reached: dict[str, Counter[str]] = {}
    for name, engine in engines.items():
        for text in engine.received:
            reached.setdefault(text, Counter())[arm_of[name]] += 1
    shadow_arm = {r["pair_id"]: r["arm"] for r in rows if r["shadow"]}
    for s in load.sent:
        rec = primaries[s.request_id]
        arms = reached.get(s.text, Counter())
        shadow = [shadow_arm[s.request_id]] if s.request_id in shadow_arm else []
        assert arms <= Counter([rec["arm"], *shadow]), (s, arms)
        if s.status == 200 and s.complete:
            assert arms[rec["arm"]] >= 1, (s, arms)
        if rec["rerouted_from"] is not None:
            assert arms["speculative"] == 0, (s, arms)
    assert set(reached) <= {s.text for s in load.sent}  # the clients' requests, nothing else

    # What the stats job reads: neither the usable rows nor the rollups hold a rerouted request.
    usable = await store.read_records(run_id=RUN, columns=["request_id"], usable_only=True)
    usable_ids = {row[0] for arm_rows in usable.values() for row in arm_rows}
    assert usable_ids.isdisjoint(r["request_id"] for r in rerouted)
    rollups = await read_rollups(store, run_id=RUN, metric="e2e")
    usable_primary = [
        r for r in primaries.values() if r["arm"] == "baseline" and r["request_id"] in usable_ids
    ]
    assert int(rollups["baseline"].n.sum()) == len(usable_primary)
    assert store.dropped == 0
    fault_row(
        "treatment killed under load",
        f"{len(after)} started after a kill: "
        f"{sum(s.status != 200 or not s.complete for s in after)} failed (in flight on s1)",
        f"{len(rerouted)} rerouted ({reasons['connect']} connect, {reasons['down']} down)",
        0,
        rss_before,
        rss_bytes(),
    )
