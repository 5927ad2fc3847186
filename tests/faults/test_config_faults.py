"""Config mistakes a real `specproxy serve` process must refuse with one line naming the setting
(issue 29, defect 10): a float port gave a traceback, a non-numeric window a misleading "missing
setting(s)", and a misspelt `SPECPROXY_*` variable was ignored, so every replica ran on its own
`./specproxy.db` instead of the shared store."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.faults.conftest import RUN
from tests.faults.serve_proc import refusal

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
    status, stderr = await refusal(tmp_path, toml, env)
    assert status is not None, "serve runs despite the mistake"
    assert status == 2, stderr  # the CLI's configuration error, not a crash (1)
    assert "Traceback" not in stderr, stderr
    errors = [line for line in stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1 and said in errors[0], stderr
    # refused before anything started: no store made in the working directory either (main's
    # SPECPROXY_STORE_URL replica ran on ./specproxy.db)
    assert not _stores(tmp_path), _stores(tmp_path)


def _stores(directory: Path) -> list[Path]:
    return list(directory.glob("*.db*"))
