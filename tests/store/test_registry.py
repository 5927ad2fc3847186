"""The store-scheme registry: one list of schemes, backends registered by scheme, read by config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from specproxy.config import StoreConfig
from specproxy.errors import ConfigError
from specproxy.store.factory import open_store
from specproxy.store.registry import (
    BACKEND_MODULES,
    STORE_SCHEMES,
    backend_class,
    register_backend,
)


@pytest.mark.parametrize("scheme", STORE_SCHEMES)
def test_every_scheme_opens_the_backend_its_module_registered(scheme: str, tmp_path: Path) -> None:
    url = {
        "sqlite": f"sqlite:///{tmp_path / 's.db'}",
        "memory": "memory://",
    }.get(scheme, f"{scheme}://user@127.0.0.1:9/db")
    store = open_store(StoreConfig(url=url, spill_path=str(tmp_path / "spill.jsonl")))
    assert type(store).__module__ == BACKEND_MODULES[scheme]
    assert backend_class(scheme) is type(store)


def test_config_accepts_exactly_the_registered_schemes() -> None:
    for scheme in STORE_SCHEMES:
        StoreConfig(url=f"{scheme}://host/db")
    with pytest.raises(ConfigError, match="'mysql' is not one of sqlite://, postgresql://"):
        StoreConfig(url="mysql://host/db")
    with pytest.raises(ConfigError, match="'mysql' is not one of"):
        backend_class("mysql")


def test_a_backend_must_be_listed_for_its_scheme() -> None:
    class Elsewhere:
        pass

    with pytest.raises(ValueError, match="BACKEND_MODULES"):
        register_backend("sqlite")(Elsewhere)  # sqlite:// belongs to specproxy.store.sqlite
    with pytest.raises(ValueError, match="BACKEND_MODULES"):
        register_backend("duckdb")(Elsewhere)  # not a known scheme at all
    assert backend_class("sqlite").__name__ == "SqliteStore"  # the real one stays registered


def test_config_reads_the_registry_without_loading_a_backend() -> None:
    """config imports store.registry at module level: the store package must stay import-light."""
    code = (
        "import sys, specproxy.config\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('specproxy.store'))\n"
        "print(loaded)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "['specproxy.store', 'specproxy.store.registry']"
