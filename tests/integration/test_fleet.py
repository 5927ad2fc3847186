"""A fleet with real parts: three `specproxy serve` replicas, one PostgreSQL, two engines per arm.

Set-up, all on loopback: a PostgreSQL cluster started by the test; four emulated vLLM servers
(two speculative with different acceptance, two baseline); three `specproxy serve` processes,
each with both arms as two-endpoint pools, sharing the PostgreSQL store; a real Prometheus
scraping all three with the shipped rules; closed-loop clients spread over the replicas.

Then: exactly one replica is the stats leader and the dashboard's stats, engine and request
queries return series aggregated across replicas (no `instance` label); one speculative engine
dies: clients see no error beyond the calls in flight on it, `specproxy_engine_up` of that
endpoint drops to 0, no restart is counted, and the arm's acceptance becomes the surviving
engine's; the leader replica is stopped: another takes the lock and publishes a newer result;
after a graceful stop of all replicas every answered request has its record in PostgreSQL.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from specproxy import metrics as m
from specproxy.emulator.config import EmulatorConfig
from specproxy.emulator.server import run_emulator
from specproxy.grafana.dashboard import build_dashboard, panel_queries
from specproxy.proxy import REQUEST_ID_HEADER
from tests.conftest import require_binary
from tests.integration.test_prometheus import Prometheus, run_prometheus, substitute
from tests.store.pgcluster import PgCluster, find_pg_bin

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny-llama"
RUN = "fleet"
STATS_INTERVAL_S = 2.0
CLIENTS = 6
RATE_INTERVAL = "15s"
ACCEPTANCE_WINDOW_S = 10  # scrapes averaged for the acceptance after an engine dies
DEADLINE_S = 90.0
# Mean accepted / drafted tokens of the emulator with k = 4 draft positions and per-position
# acceptance alpha: (alpha + alpha^2 + alpha^3 + alpha^4) / 4.
K = 4


def expected_acceptance(alpha: float) -> float:
    return sum(alpha**i for i in range(1, K + 1)) / K


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class Replica:
    index: int
    url: str
    process: asyncio.subprocess.Process
    log: Path
    answered: list[str] = field(default_factory=list)  # request ids of 200 answers
    stopping: bool = False  # clients stop picking it


def _config(port: int, db: str, spec: list[str], base: list[str], workdir: Path) -> str:
    def urls(values: list[str]) -> str:
        return "[" + ", ".join(f'"{u}"' for u in values) + "]"

    return f"""
run_id = "{RUN}"
host = "127.0.0.1"
port = {port}

[speculative]
urls = {urls(spec)}

[baseline]
urls = {urls(base)}

[outlier]
eject_after_failures = 2
base_ejection_s = 5

[store]
url = "{db}"
flush_interval_s = 0.2
spill_path = "{workdir / "spill.jsonl"}"

[scrape]
interval_s = 1.0

[warmup]
requests = 0
restart_requests = 0
restart_seconds = 0.0

[stats]
interval_s = {STATS_INTERVAL_S}
windows_s = [30, "all"]
resamples = 100
"""


async def start_replica(
    index: int, tmp: Path, db: str, spec: list[str], base: list[str]
) -> Replica:
    workdir = tmp / f"replica{index}"
    workdir.mkdir()
    port = _free_port()
    config = workdir / "specproxy.toml"
    config.write_text(_config(port, db, spec, base, workdir))
    log = workdir / "serve.log"
    with log.open("wb") as out:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "specproxy",
            "serve",
            "--config",
            str(config),
            cwd=REPO,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )
    replica = Replica(index, f"http://127.0.0.1:{port}", process, log)
    async with aiohttp.ClientSession() as session:
        for _ in range(600):
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(replica.url + "/healthz") as resp:
                    if resp.status == 200:
                        return replica
            if process.returncode is not None:
                break
            await asyncio.sleep(0.1)
    pytest.fail(f"replica {index} did not start:\n{log.read_text()}")


async def stop(replica: Replica, sig: int = signal.SIGTERM) -> None:
    if replica.process.returncode is None:
        os.kill(replica.process.pid, sig)
        try:
            await asyncio.wait_for(replica.process.wait(), 30)
        except TimeoutError:
            replica.process.kill()
            await replica.process.wait()


@dataclass
class Traffic:
    errors: list[str] = field(default_factory=list)
    sent: int = 0


async def _client(
    session: aiohttp.ClientSession, replicas: list[Replica], n: int, stop: asyncio.Event, t: Traffic
) -> None:
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Tell me about speculative decoding."}],
        "max_tokens": 16,
        "stream": n % 2 == 0,
    }
    i = n
    while not stop.is_set():
        live = [r for r in replicas if r.process.returncode is None and not r.stopping]
        replica = live[i % len(live)]
        i += 1
        try:
            async with session.post(replica.url + "/v1/chat/completions", json=body) as resp:
                await resp.read()
                t.sent += 1
                if resp.status == 200:
                    replica.answered.append(resp.headers[REQUEST_ID_HEADER])
                else:
                    t.errors.append(f"{replica.index}: HTTP {resp.status}")
        except aiohttp.ClientError as exc:  # the replica being stopped
            t.errors.append(f"{replica.index}: {exc!r}")


@contextlib.asynccontextmanager
async def traffic(replicas: list[Replica]) -> AsyncIterator[Traffic]:
    stop_event = asyncio.Event()
    t = Traffic()
    async with aiohttp.ClientSession() as session:
        tasks = [
            asyncio.create_task(_client(session, replicas, n, stop_event, t))
            for n in range(CLIENTS)
        ]
        try:
            yield t
        finally:
            stop_event.set()
            await asyncio.gather(*tasks)


async def leader_of(replicas: list[Replica]) -> Replica | None:
    async with aiohttp.ClientSession() as session:
        for replica in replicas:
            if replica.process.returncode is not None:
                continue
            with contextlib.suppress(aiohttp.ClientError):
                async with session.get(replica.url + "/metrics") as resp:
                    text = await resp.text()
                if f"\n{m.STATS_LEADER} 1.0" in text:
                    return replica
    return None


async def computed_at(replica: Replica) -> float | None:
    async with aiohttp.ClientSession() as session, session.get(replica.url + "/api/stats") as r:
        if r.status != 200:
            return None
        value: float = (await r.json())["computed_at"]
        return value


async def value(prometheus: Prometheus, expr: str) -> list[float]:
    return [float(s["value"][1]) for s in await prometheus.query(expr)]


async def test_three_replicas_two_engines_per_arm(tmp_path: Path) -> None:
    prometheus_bin = require_binary("prometheus")
    initdb = require_binary("initdb", *(p for p in [find_pg_bin("initdb")] if p))
    cluster = PgCluster(initdb)
    await asyncio.to_thread(cluster.start)
    replicas: list[Replica] = []
    try:
        db = await asyncio.to_thread(cluster.create_database, "fleet")

        def emulator(alpha: float | None, seed: int) -> EmulatorConfig:
            return EmulatorConfig(
                speculative=alpha is not None,
                acceptance=alpha if alpha is not None else 0.7,
                acceptance_spread=0.0,
                warmup_requests=0,
                default_output_tokens=16,
                seed=seed,
            )

        async with contextlib.AsyncExitStack() as engines:
            spec_live = await engines.enter_async_context(run_emulator(emulator(0.8, 1)))
            dying = contextlib.AsyncExitStack()
            spec_dying = await dying.enter_async_context(run_emulator(emulator(0.5, 2)))
            base = [
                await engines.enter_async_context(run_emulator(emulator(None, s))) for s in (3, 4)
            ]
            spec = [spec_live, spec_dying]
            replicas = list(
                await asyncio.gather(
                    *(start_replica(i, tmp_path, db, spec, base) for i in range(3))
                )
            )
            targets = [r.url.removeprefix("http://") for r in replicas]
            async with (
                traffic(replicas) as load,
                run_prometheus(prometheus_bin, tmp_path, targets) as prometheus,
            ):
                await check_one_leader_and_aggregated_dashboard(prometheus, replicas, db)
                await check_engine_death(prometheus, dying, spec_dying, load)
                failover_s = await check_leader_failover(replicas)
                print(f"stats leader failover: {failover_s:.2f} s (interval {STATS_INTERVAL_S} s)")
            for replica in replicas:
                await stop(replica)
            await check_no_record_lost(db, replicas)
    finally:
        for replica in replicas:
            await stop(replica, signal.SIGKILL)
        await asyncio.to_thread(cluster.close)


async def check_one_leader_and_aggregated_dashboard(
    prometheus: Prometheus, replicas: list[Replica], db: str
) -> None:
    samples = await prometheus.wait_for(
        f'{m.SAMPLES}{{model="{MODEL}",arm="speculative"}} > 30', DEADLINE_S
    )
    assert samples, "no stats samples in Prometheus"
    leaders = await prometheus.wait_for(f"count({m.STATS_LEADER}) == 3", DEADLINE_S)
    assert leaders, "not every replica exports the leader gauge"
    assert await value(prometheus, f"sum({m.STATS_LEADER})") == [1.0]  # exactly one leader
    # Every replica serves a result the leader computed and stored (none computes its own).
    served = [await computed_at(r) for r in replicas]
    conn = await asyncpg.connect(db)
    try:
        stored = {r["t"] for r in await conn.fetch("SELECT t FROM stats_history")}
    finally:
        await conn.close()
    assert all(t in stored for t in served), (served, sorted(stored)[-5:])
    await asyncio.sleep(16)  # fill the rate() windows
    variables = {
        "model": MODEL,
        "model:text": MODEL,
        "window": "all",
        "statistic": "median",
        "arm": ".*",  # every treatment
        "instance": ".*",
        "__rate_interval": RATE_INTERVAL,
    }
    fleet_wide = (m.SPEEDUP, m.SAMPLES, m.VERDICT, m.P99_SLOWDOWN, m.ENGINE_ACCEPTANCE_RATIO)
    checked = 0
    for title, expr, instant in panel_queries(build_dashboard()):
        query = substitute(expr, variables)
        result = await (prometheus.query(query) if instant else prometheus.query_range(query))
        if any(name in expr for name in fleet_wide) or "sum by" in expr:
            per_replica = [s["metric"] for s in result if "instance" in s["metric"]]
            assert not per_replica, f"{title}: one series per replica: {query}"
            checked += 1
    assert checked > 10


async def check_engine_death(
    prometheus: Prometheus, dying: contextlib.AsyncExitStack, dead_url: str, load: Traffic
) -> None:
    errors_before = len(load.errors)
    await dying.aclose()  # the second speculative engine is gone
    down = await prometheus.wait_for(
        f'count({m.ENGINE_UP}{{arm="speculative",endpoint="{dead_url}"}} == 0) == 3', DEADLINE_S
    )
    assert down, "engine_up of the dead endpoint did not drop on every replica"
    # Then the arm's acceptance is the survivor's (alpha 0.8) on every replica, not a mix. Each
    # value covers one scrape interval's drafts, few on a loaded machine, so the check averages
    # a window that begins after the death (the wait is a lower bound, not a hope that scrapes
    # happened) and polls until the deadline: a mix (about 0.41) never comes within 0.1.
    await asyncio.sleep(ACCEPTANCE_WINDOW_S + 1)
    sent = load.sent
    survivor = expected_acceptance(0.8)
    averaged = (
        f'avg_over_time({m.ENGINE_ACCEPTANCE_RATIO}{{arm="speculative"}}[{ACCEPTANCE_WINDOW_S}s])'
    )
    settled = await prometheus.wait_for(
        f"count(abs({averaged} - {survivor}) < 0.1) == 3", DEADLINE_S
    )
    assert settled, (await value(prometheus, averaged), survivor)
    restarts = await value(prometheus, f'{m.ENGINE_RESTARTS}_total{{arm="speculative"}}')
    assert restarts == [0.0, 0.0, 0.0]
    await asyncio.sleep(3)
    assert load.sent > sent  # traffic went on
    # At most the calls in flight on the dead engine failed (each client has one call at a time).
    assert len(load.errors) - errors_before <= CLIENTS, load.errors[errors_before:]


async def check_leader_failover(replicas: list[Replica]) -> float:
    leader = await leader_of(replicas)
    assert leader is not None
    before = await computed_at(leader)
    assert before is not None
    leader.stopping = True
    await asyncio.sleep(0.5)
    killed_at = time.time()
    await stop(leader)  # SIGTERM: the replica shuts down gracefully, flushing its records
    survivors = [r for r in replicas if r is not leader]
    while True:
        new = await leader_of(survivors)
        if new is not None:
            at = await computed_at(new)
            if at is not None and at > killed_at:
                break
        assert time.time() - killed_at < DEADLINE_S, "no replica took over"
        await asyncio.sleep(0.1)
    return at - killed_at


async def check_no_record_lost(db: str, replicas: list[Replica]) -> None:
    conn = await asyncpg.connect(db)
    try:
        rows = await conn.fetch(
            "SELECT request_id, engine_url FROM requests WHERE run_id = $1 AND NOT shadow", RUN
        )
    finally:
        await conn.close()
    stored = {r["request_id"] for r in rows}
    answered = {rid for r in replicas for rid in r.answered}
    assert len(answered) > 100
    missing = answered - stored
    assert not missing, f"{len(missing)} answered requests have no record"
    assert all(r["engine_url"] for r in rows)
