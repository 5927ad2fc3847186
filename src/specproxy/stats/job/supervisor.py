"""serve's stats process (`[stats] compute = "child"`): started with the proxy, restarted when it
dies, stopped with it.

`StatsChild` runs `python -m specproxy stats --follow` (`stats.job.process`, the same code path as
a stats process run on its own) with:
- the parent's merged, validated config as JSON in its environment (`settings.CHILD_CONFIG_ENV`):
  no file it could outlive;
- `--child-of <parent pid>`: its first act is `children.die_with_parent`, so it dies with the
  proxy even when the proxy is SIGKILLed; then it lowers its own CPU priority (`NICENESS`);
- one BLAS/OpenMP thread (`BLAS_VARIABLES`, unless the operator set them), so on a small
  machine it never competes with the relay for the other cores;
- `--status-fd`: the write end of a pipe on which it reports each change of leadership, which
  the proxy publishes as `specproxy_stats_leader`;
- its own process group, so a terminal's Ctrl-C reaches the proxy, which then stops it.
It is a plain subprocess, not a `multiprocessing` one: the spawn context would start
multiprocessing's resource tracker too, one more process per proxy.

Nothing here blocks or raises into the proxy: the owner calls `poll()` periodically (the proxy's
event loop every `POLL_S`, the `--workers` parent in its supervision loop), which reads the
status pipe without blocking, reaps the child without waiting (`Popen.poll`) and starts it again
once its backoff has passed (`RESTART_MIN_S` doubling to `RESTART_MAX_S`; a child that ran
`STABLE_S` starts over at the minimum). Stopping: SIGTERM, up to `STOP_GRACE_S`, then SIGKILL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence

from specproxy.config import Config
from specproxy.logs import JsonFormatter
from specproxy.stats.job.settings import CHILD_CONFIG_ENV

__all__ = [
    "BLAS_VARIABLES",
    "NICENESS",
    "POLL_S",
    "RESTART_MAX_S",
    "RESTART_MIN_S",
    "STABLE_S",
    "STOP_GRACE_S",
    "StatsChild",
    "child_environment",
    "needs_stats_process",
]

log = logging.getLogger(__name__)

POLL_S = 0.5
STOP_GRACE_S = 10.0
RESTART_MIN_S = 1.0
RESTART_MAX_S = 60.0
STABLE_S = 60.0
NICENESS = 10  # added to the parent's: the scheduler prefers the relay whenever both can run
BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def needs_stats_process(cfg: Config) -> bool:
    """Whether serve starts a stats process for `cfg` (a memory:// store computes inline)."""
    return cfg.stats.compute == "child" and not cfg.store.url.startswith("memory:")


def child_environment(cfg: Config, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The stats process's environment: the parent's, the config, one BLAS thread."""
    env = dict(os.environ if environ is None else environ)
    env[CHILD_CONFIG_ENV] = json.dumps(cfg.to_mapping())
    if not any(name in env for name in BLAS_VARIABLES):  # an operator's own choice wins
        env.update(dict.fromkeys(BLAS_VARIABLES, "1"))
    return env


def _log_flags() -> list[str]:
    """The stats process logs as this one does (level and format of the root logger)."""
    root = logging.getLogger()
    level = logging.getLevelName(root.level).lower()
    flags = ["--log-level", level] if level in ("debug", "info", "warning", "error") else []
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        flags += ["--log-format", "json"]
    return flags


def _how(code: int) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    return f"exited with status {code}"


class StatsChild:
    """One stats process at a time, owned by the calling process."""

    def __init__(
        self,
        cfg: Config,
        *,
        program: Sequence[str] = (sys.executable, "-m", "specproxy"),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._program = list(program)
        self._env = child_environment(cfg)
        self._clock = clock
        self._proc: subprocess.Popen[bytes] | None = None
        self._status: int | None = None  # read end of the status pipe
        self._started_at = 0.0
        self._next_start = 0.0  # the first poll starts it
        self._failures = 0  # exits in a row, each after less than STABLE_S
        self._stopping = False
        self.restarts = 0
        self.leader: bool | None = None  # what the running child last reported

    @property
    def pid(self) -> int | None:
        """The running child's pid."""
        return self._proc.pid if self._proc is not None else None

    def is_leader(self) -> bool | None:
        return self.leader

    def poll(self) -> None:
        """Read its status, notice its exit, start it when due. Never blocks, never raises for
        the child's sake (a failed start is logged and retried after the backoff)."""
        if self._stopping:
            return
        if self._proc is not None:
            self._read_status()
            code = self._proc.poll()
            if code is None:
                return
            self._exited(code)
        if self._clock() >= self._next_start:
            self._spawn()

    def _spawn(self) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec (PEP 446); pass_fds opens one
        os.set_blocking(read_end, False)
        argv = [*self._program, "stats", "--follow", "--child-of", str(os.getpid())]
        argv += ["--status-fd", str(write_end), *_log_flags()]
        try:
            self._proc = subprocess.Popen(
                argv,
                env=self._env,
                stdin=subprocess.DEVNULL,
                pass_fds=(write_end,),
                process_group=0,
            )
        except OSError as exc:
            os.close(read_end)
            log.error("stats: cannot start the stats process: %s", exc)
            self._backoff()
            return
        finally:
            os.close(write_end)
        self._status = read_end
        self._started_at = self._clock()
        log.info("stats: started the stats process (pid %d)", self._proc.pid)

    def _read_status(self) -> None:
        if self._status is None:
            return
        try:
            data = os.read(self._status, 4096)
        except BlockingIOError:
            return
        lines = [line for line in data.split(b"\n") if line]
        if lines:
            self.leader = lines[-1] == b"leader"

    def _exited(self, code: int) -> None:
        assert self._proc is not None
        pid, ran = self._proc.pid, self._clock() - self._started_at
        self._close()
        delay = self._backoff(ran)
        self.restarts += 1
        log.warning(
            "stats: the stats process (pid %d) %s after %.1f s; starting it again in %.0f s",
            pid,
            _how(code),
            ran,
            delay,
        )

    def _backoff(self, ran: float = 0.0) -> float:
        self._failures = 1 if ran >= STABLE_S else self._failures + 1
        delay = min(RESTART_MAX_S, RESTART_MIN_S * 2.0 ** (self._failures - 1))
        self._next_start = self._clock() + delay
        return delay

    def _close(self) -> None:
        if self._status is not None:
            os.close(self._status)
        self._proc, self._status, self.leader = None, None, None

    def terminate(self) -> None:
        """SIGTERM the child, and start no other."""
        self._stopping = True
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM, wait up to `grace_s`, then SIGKILL (blocking: for the `--workers` parent)."""
        self.terminate()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            log.info("stats: the stats process (pid %d) stopped", self._proc.pid)
            self._close()

    async def _reaped(self, proc: subprocess.Popen[bytes], deadline: float) -> bool:
        """Whether `proc` exited by `deadline` (polled: nothing blocks the loop)."""
        while True:
            if proc.poll() is not None:
                return True
            if self._clock() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def aclose(self, grace_s: float = STOP_GRACE_S) -> None:
        """`stop` without blocking the event loop."""
        self.terminate()
        proc = self._proc
        if proc is None:
            return
        if not await self._reaped(proc, self._clock() + grace_s):
            proc.kill()
            await self._reaped(proc, math.inf)
        log.info("stats: the stats process (pid %d) stopped", proc.pid)
        self._close()
