"""A slim runtime: `pip install specproxy` is the proxy and the statistics; the report (matplotlib)
and parquet export (pyarrow) are extras, and a command that needs a missing one says which."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from specproxy.errors import ConfigError
from specproxy.extras import EXTRAS, require

REPO = Path(__file__).resolve().parents[1]


def _without(module: str, *argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`specproxy *argv` in a Python where `module` cannot be imported."""
    code = (
        f"import sys; sys.modules[{module!r}] = None\n"
        "from specproxy.cli import main\n"
        f"raise SystemExit(main({list(argv)!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_the_runtime_dependencies_are_the_proxy_and_the_statistics() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = {d.split(">")[0].split("[")[0].split(";")[0].strip() for d in project["dependencies"]}
    assert names == {
        "aiohttp",
        "multidict",
        "yarl",
        "prometheus-client",
        "numpy",
        "scipy",
        "rich",
        "uvloop",
    }
    extras = project["optional-dependencies"]
    assert extras["report"] == ["matplotlib>=3.8"] and extras["parquet"] == ["pyarrow>=15"]
    assert set(EXTRAS.values()) <= set(extras)
    # the image installs the proxy, the statistics and the PostgreSQL driver, nothing more
    assert '"specproxy[postgres]==${VERSION}"' in (REPO / "Dockerfile").read_text()
    assert "-e '.[report]'" in (REPO / "Makefile").read_text()  # `make demo` writes a report


def test_require_names_the_extra() -> None:
    require("asyncpg", "the PostgreSQL store")  # installed: nothing happens
    with pytest.raises(
        ConfigError, match=r"report needs matplotlib: pip install 'specproxy\[report\]'"
    ):
        sys.modules["matplotlib"] = None  # type: ignore[assignment]
        try:
            require("matplotlib", "the report")
        finally:
            del sys.modules["matplotlib"]


@pytest.mark.parametrize(
    ("argv", "what"),
    [
        (["report", "--store", "sqlite:///nothing.db"], "specproxy report"),
        (["demo", "--duration", "1", "--port", "0"], "the demo's report"),
    ],
    ids=["report", "demo"],
)
def test_a_command_without_its_extra_is_one_clear_error(
    tmp_path: Path, argv: list[str], what: str
) -> None:
    done = _without("matplotlib", *argv, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"specproxy: error: {what} needs matplotlib: pip install 'specproxy[report]'"
    )
    assert list(tmp_path.iterdir()) == []  # nothing started, nothing written


def _declared() -> set[str]:
    """Every distribution pyproject names: the dependencies and each extra's (normalised)."""
    import re

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    return {re.split(r"[<>=!~;\[ ]", s, maxsplit=1)[0].lower().replace("_", "-") for s in specs}


def test_every_package_src_imports_is_declared() -> None:
    """Issue 28 item 5: multidict, yarl and niquests were imported but not declared, so a bare
    install worked only while aiohttp and grafana-client happened to pull them in."""
    import ast
    import importlib.metadata

    distributions = importlib.metadata.packages_distributions()
    imported: set[str] = set()
    for path in (REPO / "src" / "specproxy").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported.add(node.module.split(".")[0])
    third_party = imported - set(sys.stdlib_module_names) - {"specproxy", "__future__"}
    declared = _declared()
    missing = {
        module: distributions.get(module)
        for module in sorted(third_party)
        if not {d.lower().replace("_", "-") for d in distributions.get(module, [module])} & declared
    }
    assert missing == {}


def test_dashboards_push_without_the_grafana_extra_is_one_clear_error(tmp_path: Path) -> None:
    """Issue 28 item 5: it printed a 16-line ImportError traceback."""
    done = _without(
        "grafana_client", "dashboards", "push", "--grafana-url", "http://127.0.0.1:9", cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        "specproxy: error: specproxy dashboards push needs grafana_client: "
        "pip install 'specproxy[grafana]'"
    ]
