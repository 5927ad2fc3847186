"""No import cycle in src/specproxy: every module's imports, read with `ast`, form a DAG.

What counts as an import (the strictest reading; it is what found the four cycles of issue 17):
- every `import` and `from ... import` statement anywhere in a module: at module level, inside
  functions and methods (they run later, but a cycle through them is still a cycle: the two
  modules cannot be understood, tested or moved apart), and under `if TYPE_CHECKING:` (mypy
  resolves those, and one runtime use turns them into a real cycle);
- `import a.b.c` depends on `a.b.c`; `from a.b import c` depends on `a.b` (its namespace is
  read, so its `__init__` must have run) and also on `a.b.c` when that is a module;
- relative imports are resolved against the importing module's package.
Not counted: the implicit initialisation of parent packages that every import performs (with it,
each package `__init__` that re-exports a submodule would be a cycle with that submodule), and a
package importing its own names. Modules outside the package (stdlib, aiohttp, ...) are leaves.

The walker is tested on constructed packages too, so that the real check cannot pass because the
walker sees nothing.

Because parent packages are not edges, a package whose `__init__` imports its modules can still
break at run time: `config` importing `store.registry` runs `store/__init__`, which must then not
import a module that imports `config` back. The slow test imports every module first, each in a
clean `sys.modules`, which is the check for that.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "specproxy"


def module_files(package_dir: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under `package_dir` (a package)."""
    modules: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def _imported(tree: ast.AST, module: str, is_package: bool) -> Iterator[str]:
    """Every module name an import statement in `tree` refers to (see the module docstring)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):  # walks function bodies and `if TYPE_CHECKING:` blocks too
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            yield target
            yield from (f"{target}.{alias.name}" for alias in node.names)


def import_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports."""
    files = module_files(package_dir)
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        names = _imported(tree, module, path.name == "__init__.py")
        graph[module] = {name for name in names if name in files and name != module}
    return graph


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One cycle as a path [m0, m1, ..., m0], or None when the graph is acyclic."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path: list[str] = [root]
        on_path = {root}
        stack = [iter(sorted(graph[root]))]
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                stack.pop()
                done.add(path[-1])
                on_path.discard(path.pop())
            elif nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            elif nxt not in done:
                path.append(nxt)
                on_path.add(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_src_has_no_import_cycle() -> None:
    graph = import_graph(SRC)
    # The walker sees the real package: many modules, and the edges we know are there.
    assert len(graph) > 80
    assert "specproxy.appkeys" in graph["specproxy.app"]
    assert "specproxy.report.build" in graph["specproxy.demo.runner"]  # a function-level import
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_appkeys_is_a_leaf_at_run_time() -> None:
    """Every component reads the app keys from here, so it must import nothing that runs."""
    tree = ast.parse((SRC / "appkeys.py").read_text(encoding="utf-8"))
    top_level: list[ast.stmt] = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    names = set(_imported(ast.Module(body=top_level, type_ignores=[]), "specproxy.appkeys", False))
    assert "aiohttp" in names  # the walker sees its imports
    assert not {name for name in names if name.split(".")[0] == "specproxy"}


# Imports every module of a package first, each in a sys.modules without the package; prints the
# number of modules, then one line per module that fails to import.
_EACH_FIRST = """
import importlib, pkgutil, sys
package = importlib.import_module(sys.argv[1])
names = sorted(
    m.name for m in pkgutil.walk_packages(package.__path__, sys.argv[1] + ".")
    if not m.name.endswith(".__main__")
)
print(len(names))
for name in names:
    for loaded in [m for m in sys.modules if m.split(".")[0] == sys.argv[1]]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        print(name, repr(exc))
"""


def import_each_first(package: str, path: Path) -> tuple[int, list[str]]:
    """(modules tried, failures) of importing every module of `package` (found on `path`) first."""
    proc = subprocess.run(
        [sys.executable, "-c", _EACH_FIRST, package],
        capture_output=True,
        text=True,
        cwd=path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # e.g. walking the package failed
    out = proc.stdout.splitlines()
    return int(out[0]), out[1:]


@pytest.mark.slow
def test_every_module_imports_first() -> None:
    count, failures = import_each_first("specproxy", SRC.parent)
    assert count > 80
    assert failures == []


def test_import_each_first_finds_a_package_init_cycle(tmp_path: Path) -> None:
    """The shape the ast walk does not see: a leaf reached through a package that imports back."""
    _package(
        tmp_path,
        {
            "cfg.py": "from pkg.store.reg import SCHEMES\nclass Config: ...\n",
            "store/__init__.py": "from pkg.store.backend import Backend\n",
            "store/backend.py": "from pkg.cfg import Config\nclass Backend: ...\n",
            "store/reg.py": "SCHEMES = ('a',)\n",
        },
    )
    assert find_cycle(import_graph(tmp_path / "pkg")) is None
    count, failures = import_each_first("pkg", tmp_path)
    assert count == 4  # cfg, store, store.backend, store.reg
    assert [line.split()[0] for line in failures] == ["pkg.cfg"]
    assert "partially initialized" in failures[0]


def _package(root: Path, files: Mapping[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return pkg


@pytest.mark.parametrize(
    ("files", "cycle"),
    [
        pytest.param(
            {"a.py": "from pkg.b import x\n", "b.py": "import pkg.a\nx = 1\n"},
            ["pkg.a", "pkg.b", "pkg.a"],
            id="module-level",
        ),
        pytest.param(
            {
                "app.py": "from pkg.ctx import ctx\nKEY = 1\n",
                "ctx.py": "def ctx():\n    from pkg.app import KEY\n    return KEY\n",
            },
            ["pkg.app", "pkg.ctx", "pkg.app"],
            id="function-level, as app.py <-> */context.py was",
        ),
        pytest.param(
            {
                "sub/__init__.py": "from pkg.sub.html import render\n",
                "sub/html.py": (
                    "from typing import TYPE_CHECKING\n"
                    "if TYPE_CHECKING:\n    from pkg.sub import Data\n"
                    "def render(): ...\n"
                ),
            },
            ["pkg.sub", "pkg.sub.html", "pkg.sub"],
            id="TYPE_CHECKING, as report <-> report.html was",
        ),
        pytest.param(
            {
                "emu/__init__.py": "from .server import run\n",
                "emu/server.py": "from .protocol import parse\ndef run(): ...\n",
                "emu/protocol.py": "from pkg.emu import vocab\ndef parse(): ...\n",
                "emu/vocab.py": "",
            },
            ["pkg.emu", "pkg.emu.server", "pkg.emu.protocol", "pkg.emu"],
            id="relative and through a package namespace, as the emulator was",
        ),
    ],
)
def test_walker_finds_a_constructed_cycle(
    tmp_path: Path, files: dict[str, str], cycle: list[str]
) -> None:
    found = find_cycle(import_graph(_package(tmp_path, files)))
    assert found is not None
    # The same cycle, whichever module the search happened to enter it from.
    assert sorted(set(found)) == sorted(set(cycle)) and found[0] == found[-1]
    assert len(found) == len(cycle)


def test_walker_accepts_re_exports_and_outside_imports(tmp_path: Path) -> None:
    pkg = _package(
        tmp_path,
        {
            "__init__.py": "from pkg.core import run\n",
            "core.py": "import json\nimport pkg.util as util\nfrom .util import helper\n",
            "util.py": "from collections.abc import Mapping\ndef helper(): ...\n",
        },
    )
    graph = import_graph(pkg)
    assert graph == {"pkg": {"pkg.core"}, "pkg.core": {"pkg.util"}, "pkg.util": set()}
    assert find_cycle(graph) is None


# The floors (issue 23): `summary` lies under both store and stats; the store never reaches
# into the statistics; nothing below `stats` imports it.
FLOORS: dict[str, tuple[str, ...]] = {
    "specproxy.summary": ("specproxy.store", "specproxy.stats"),
    "specproxy.store": ("specproxy.stats",),
    "specproxy.records": ("specproxy.store", "specproxy.stats", "specproxy.summary"),
}


def test_the_summary_floor_lies_under_store_and_stats() -> None:
    graph = import_graph(SRC)
    crossings = [
        (module, target)
        for module, targets in graph.items()
        for floor, above in FLOORS.items()
        if module == floor or module.startswith(floor + ".")
        for target in targets
        if any(target == a or target.startswith(a + ".") for a in above)
    ]
    assert crossings == []
    assert any(m.startswith("specproxy.summary.") for m in graph)  # the walker saw the floor
