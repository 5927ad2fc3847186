"""`specproxy serve --workers N`: N proxy processes on one port, one /metrics view.

The parent starts N copies of the same `serve` command and does nothing else: it forwards
SIGTERM/SIGINT to them, reaps every one of them, and when any one dies on its own it stops the
others and exits with its status (the supervisor above, systemd or Kubernetes, restarts the whole
pod). It does not restart the one worker: the merged counters would drop by what that worker had
counted, which Prometheus reads as a reset of the whole series and counts the survivors' totals
again as new increase; a whole restart is a true reset that `rate()` handles. Each worker
(`SPECPROXY_WORKER_DIR`/`SPECPROXY_WORKER_INDEX` in its environment) is a complete proxy:

- it listens on the shared port with SO_REUSEPORT, so the kernel spreads connections;
- it has its own store writer, engine scraper and endpoint pools, and serves the statistics
  the one stats process stores: with `[stats] compute = "child"` this parent starts that process
  (`stats.job.supervisor.StatsChild`, restarted when it dies, stopped last) and runs the workers
  with `SPECPROXY_STATS__COMPUTE=external`, so none starts its own;
- it also listens on a private Unix socket in the worker directory, where its siblings read
  its own registry (`GET /metrics?local=1`); whichever worker answers a scrape merges every
  worker's page (`merge.merge_pages`). Each worker's registry stays a plain single-process one,
  so the request path's lock-free histograms are untouched.

Workers and the stats process get SIGKILL from the kernel when the parent dies, however it dies
(`children.die_with_parent`), so nothing is orphaned even after SIGKILL of the parent.
"""

from __future__ import annotations

import asyncio
import functools
import glob
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import FrameType
from typing import TYPE_CHECKING

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest

from specproxy.children import die_with_parent
from specproxy.fleet.merge import merge_pages

if TYPE_CHECKING:
    from specproxy.stats.job.supervisor import StatsChild

__all__ = [
    "STATS_COMPUTE_ENV",
    "WORKER_DIR_ENV",
    "WORKER_INDEX_ENV",
    "Worker",
    "merged_metrics",
    "supervise",
    "this_worker",
    "worker_argv",
]

STATS_COMPUTE_ENV = "SPECPROXY_STATS__COMPUTE"
WORKER_DIR_ENV = "SPECPROXY_WORKER_DIR"
WORKER_INDEX_ENV = "SPECPROXY_WORKER_INDEX"
log = logging.getLogger(__name__)
_PEER_TIMEOUT_S = 5.0
_POLL_S = 0.2
_STOP_GRACE_S = 60.0  # after SIGTERM, a worker that has not exited by then is killed


@dataclass(frozen=True, slots=True)
class Worker:
    """This process's place among the workers."""

    directory: str
    index: int

    @property
    def socket(self) -> str:
        return os.path.join(self.directory, f"worker-{self.index}.sock")


def this_worker() -> Worker | None:
    """The worker this process is, if a `--workers` parent started it."""
    directory = os.environ.get(WORKER_DIR_ENV)
    index = os.environ.get(WORKER_INDEX_ENV)
    if directory is None or index is None:
        return None
    return Worker(directory, int(index))


def worker_argv(argv: Sequence[str]) -> list[str]:
    """The command line without `--workers N` / `--workers=N`: what each worker runs."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--workers":
            skip = True
        elif not arg.startswith("--workers="):
            out.append(arg)
    return out


def supervise(argv: Sequence[str], workers: int, *, stats_child: StatsChild | None = None) -> int:
    """Run `python -m specproxy *argv` `workers` times until they exit; their exit status.
    `stats_child`: the stats process this parent runs for them (started first, stopped last)."""
    parent = os.getpid()
    directory = tempfile.mkdtemp(prefix="specproxy-workers-")
    procs: list[subprocess.Popen[bytes]] = []
    stopping = False

    def forward(signum: int, frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True
        if stats_child is not None:
            stats_child.terminate()
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        base_env = dict(os.environ)
        if stats_child is not None:
            stats_child.poll()  # starts it
            base_env[STATS_COMPUTE_ENV] = "external"
        for index in range(workers):
            env = {**base_env, WORKER_DIR_ENV: directory, WORKER_INDEX_ENV: str(index)}
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "specproxy", *argv],
                    env=env,
                    preexec_fn=functools.partial(die_with_parent, parent),
                )
            )
        stop_at: float | None = None
        while True:
            dead = [proc for proc in procs if proc.poll() is not None]  # poll() reaps each
            if len(dead) == len(procs):
                break
            if dead and not stopping:  # a worker died on its own: stop the rest
                status = dead[0].returncode or 1
                log.error(
                    "worker pid %d exited with status %d: stopping the other %d workers",
                    dead[0].pid,
                    dead[0].returncode,
                    len(procs) - len(dead),
                )
                forward(signal.SIGTERM, None)
            if stopping and stop_at is None:
                stop_at = time.monotonic() + _STOP_GRACE_S
            if stop_at is not None and time.monotonic() > stop_at:
                break  # the finally below kills what is left
            if stats_child is not None:
                stats_child.poll()  # restarts it if it died
            time.sleep(_POLL_S)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if stats_child is not None:
            stats_child.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        shutil.rmtree(directory, ignore_errors=True)
    return status


async def merged_metrics(
    registry: CollectorRegistry, worker: Worker, *, token: str | None = None
) -> bytes:
    """This worker's page merged with every sibling's (a sibling that does not answer is left
    out: it is starting or stopping). `token`: the admin token, which a sibling's /metrics needs
    with `protect_metrics = true` (the socket is private to the workers' directory, but its
    requests pass the same guard as the TCP port's)."""
    own = await asyncio.to_thread(generate_latest, registry)
    peers = [
        path
        for path in glob.glob(os.path.join(worker.directory, "worker-*.sock"))
        if path != worker.socket
    ]
    pages = [
        own.decode(),
        *[p for p in await asyncio.gather(*(_local_page(p, token) for p in peers)) if p],
    ]
    if len(pages) == 1:
        return own
    return await asyncio.to_thread(merge_pages, pages)


async def _local_page(path: str, token: str | None) -> str | None:
    timeout = aiohttp.ClientTimeout(total=_PEER_TIMEOUT_S)
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    try:
        async with (
            aiohttp.ClientSession(
                connector=aiohttp.UnixConnector(path=path), timeout=timeout
            ) as session,
            session.get("http://worker/metrics", params={"local": "1"}, headers=headers) as resp,
        ):
            if resp.status != 200:
                log.warning("worker socket %s answered /metrics with %d", path, resp.status)
                return None
            return await resp.text()
    except (aiohttp.ClientError, TimeoutError, OSError):
        return None
