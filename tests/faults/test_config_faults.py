"""Config mistakes a real `specproxy serve` process must refuse with one line naming the setting
(issue 29, defect 10): a float port gave a traceback, a non-numeric window a misleading "missing
setting(s)", and a misspelt `SPECPROXY_*` variable was ignored, so every replica ran on its own
`./specproxy.db` instead of the shared store."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.faults.conftest import RUN
from tests.faults.serve_proc import free_port

pytestmark = pytest.mark.timeout(300)

_ARMS = 'baseline_url = "http://127.0.0.1:9"\nspeculative_url = "http://127.0.0.1:9"\n'

# config file body, extra environment, the one error line serve must print
CASES = [
    (
        f'port = 8000.5\nrun_id = "{RUN}"\n{_ARMS}',
        {},
        "specproxy: error: port must be a whole number, got 8000.5",
    ),
    (
        f'port = {{port}}\nrun_id = "{RUN}"\n{_ARMS}[stats]\nwindows_s = ["x"]\n',
        {},
        'specproxy: error: stats.windows_s entries must be seconds or "all"',
    ),
    (
        f'port = {{port}}\nrun_id = "{RUN}"\n{_ARMS}',
        {"SPECPROXY_STORE_URL": "sqlite:///shared.db"},
        "SPECPROXY_STORE_URL is not a specproxy setting (did you mean SPECPROXY_STORE__URL?)",
    ),
]


@pytest.mark.parametrize(("toml", "env", "said"), CASES, ids=["float_port", "window_x", "env"])
async def test_a_config_mistake_is_one_line_and_no_proxy(
    tmp_path: Path, toml: str, env: dict[str, str], said: str
) -> None:
    port = free_port()
    config = tmp_path / "specproxy.toml"
    config.write_text(toml.replace("{port}", str(port)))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SPECPROXY_")}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "specproxy",
        "serve",
        "--config",
        str(config),
        cwd=tmp_path,
        env={**environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        # until it exits; a proxy that listens took the mistake (a slow machine: longer only)
        for _ in range(2400):
            if proc.returncode is not None or await _listens(port):
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.1)
        assert proc.returncode is not None, "serve runs despite the mistake"
        assert proc.stderr is not None
        stderr = (await proc.stderr.read()).decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 2, stderr  # the CLI's configuration error, not a crash (1)
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and said in errors[0], stderr
    # refused before anything started: no store made in the working directory either (main's
    # SPECPROXY_STORE_URL replica ran on ./specproxy.db)
    assert not _stores(tmp_path), _stores(tmp_path)


def _stores(directory: Path) -> list[Path]:
    return list(directory.glob("*.db*"))


async def _listens(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.close()
    return True
