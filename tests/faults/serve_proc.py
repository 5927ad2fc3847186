"""A real `specproxy serve` process for the fault suite: started from a TOML file, waited for,
measured (RSS from /proc), and killed by pid; plus what its SQLite store holds."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import aiohttp

__all__ = [
    "Serve",
    "free_port",
    "kill_leftovers",
    "refusal",
    "serve_toml",
    "started",
    "stored_rows",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def serve_toml(
    upstream_url: str,
    workdir: Path,
    run_id: str,
    *,
    top: str = "",
    store_url: str | None = None,
    tables: str = "",
) -> str:
    """A serve config: both arms on `upstream_url`, a SQLite store (or `store_url`) and its spill
    file in `workdir`; `top`: more top-level keys, `tables`: more TOML tables."""
    url = store_url or f"sqlite:///{workdir}/store.db"
    return f"""{top}
baseline_url = "{upstream_url}"
speculative_url = "{upstream_url}"
run_id = "{run_id}"
[store]
url = "{url}"
spill_path = "{workdir}/spill/spill.jsonl"
{tables}"""


def stored_rows(db: Path, run_id: str) -> list[tuple[str, str | None, int]]:
    """(request_id, error_kind, status) of every stored request of `run_id`."""
    if not db.exists():
        return []
    # closed here, not when collected: a connection left open keeps SQLite's -shm mapped in
    # the test process (a test that truncates it would then crash this one)
    with contextlib.closing(sqlite3.connect(db, timeout=30)) as conn:
        return list(
            conn.execute(
                "SELECT request_id, error_kind, status FROM requests WHERE run_id = ?", (run_id,)
            )
        )


_STARTED: list[Serve] = []  # every serve started, so a failed test leaves none running


def started() -> int:
    """How many serves were started so far (a mark for `kill_leftovers`)."""
    return len(_STARTED)


def kill_leftovers(since: int = 0) -> None:
    """SIGKILL every serve started after mark `since` that still runs (its children die with
    it): after each test, so an assertion that fails before a test stops its proxies leaves no
    process behind (a module-scoped one, started before the mark, lives on)."""
    while len(_STARTED) > since:
        serve = _STARTED.pop()
        if serve.proc.poll() is None:
            serve.proc.kill()
            serve.proc.wait(30)


class Serve:
    """One `specproxy serve --config FILE` process (its stderr goes to `log`)."""

    def __init__(
        self,
        workdir: Path,
        toml: str,
        *,
        preexec_fn: Callable[[], None] | None = None,
        args: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        wrap: Sequence[str] = (),
    ) -> None:
        """`wrap`: a command that execs the rest (`unshare ...`), so `pid` is still serve's."""
        self.port = free_port()
        self.workdir = workdir
        config = workdir / "specproxy.toml"
        config.write_text(f"port = {self.port}\n{toml}")
        self.log = workdir / f"serve-{self.port}.log"
        with open(self.log, "wb") as err:
            self.proc = subprocess.Popen(
                [*wrap, sys.executable, "-m", "specproxy", "serve", "--config", str(config), *args],
                cwd=workdir,
                stdout=subprocess.DEVNULL,
                stderr=err,
                preexec_fn=preexec_fn,
                env=None if env is None else {**os.environ, **env},
            )
        self.url = f"http://127.0.0.1:{self.port}"
        _STARTED.append(self)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_bytes(self) -> int:
        return self._status_bytes("VmRSS")

    def peak_rss_bytes(self) -> int:
        """The highest RSS the process has had (VmHWM)."""
        return self._status_bytes("VmHWM")

    def _status_bytes(self, field: str) -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field}")

    async def ready(self, timeout_s: float = 120.0) -> None:
        """Until /healthz answers (a slow machine only takes longer)."""
        async with aiohttp.ClientSession() as session:
            for _ in range(int(timeout_s / 0.1)):
                assert self.proc.poll() is None, self.log.read_text()
                try:
                    async with session.get(self.url + "/healthz") as resp:
                        if resp.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise AssertionError(f"serve not ready: {self.log.read_text()}")

    async def metric(self, name: str, headers: Mapping[str, str] | None = None) -> float:
        """The sum of a metric's samples on /metrics (0 when absent)."""
        async with (
            aiohttp.ClientSession() as session,
            session.get(self.url + "/metrics", headers=headers) as resp,
        ):
            assert resp.status == 200, resp.status
            text = await resp.text()
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith(name) and not line.startswith("#")
        )

    async def wait(self, timeout_s: float = 120.0) -> int:
        return await asyncio.to_thread(self.proc.wait, timeout_s)


async def refusal(workdir: Path, toml: str, env: Mapping[str, str]) -> tuple[int | None, str]:
    """`specproxy serve` on a config it should refuse (`{port}` in `toml`: a free port), with
    only `env`'s SPECPROXY_* variables: (its exit status, its stderr) once it exits, or (None,
    its stderr) once it listens, which means it took the mistake (bounded: 240 s)."""
    port = free_port()
    config = workdir / "specproxy.toml"
    config.write_text(toml.replace("{port}", str(port)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPECPROXY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "specproxy", "serve", "--config", str(config), cwd=workdir,
        env={**environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        for _ in range(2400):  # a slow machine only takes longer
            if proc.returncode is not None or await _listens(port):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.1)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.stderr is not None
    stderr = (await proc.stderr.read()).decode()
    status = proc.returncode
    assert status is not None
    return (None if status < 0 else status), stderr


async def _listens(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True
