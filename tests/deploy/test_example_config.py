"""specproxy.example.toml: it loads, names every setting of Config, documents each one, and
states the real defaults (so it cannot drift from config.py)."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path

from specproxy.config import Config
from specproxy.config_env import setting_fields

EXAMPLE = Path(__file__).resolve().parents[2] / "specproxy.example.toml"
# Set by Config itself, not by users (the shorthand's tables take role and weight from it).
INTERNAL = {(arm, key) for arm in ("baseline", "speculative") for key in ("name", "role", "weight")}
REQUIRED = ("baseline_url", "speculative_url")  # top-level, no default
_HEADER = re.compile(r"^#?\s*\[(\w+)\]\s*$")
_KEY = re.compile(r"^(#\s*)?([a-z][a-z0-9_]*)\s*=")


def documented_keys(text: str) -> dict[tuple[str | None, str], bool]:
    """{(table, key): documented} for each key line, set or shown commented out; documented means
    the line right above it is a comment (not another key, not a table header)."""
    keys: dict[tuple[str | None, str], bool] = {}
    table: str | None = None
    previous = ""
    for line in text.splitlines():
        header = _HEADER.match(line)
        key = _KEY.match(line)
        if header:
            table = header.group(1)
        elif key:
            prose = previous.startswith("#") and not _KEY.match(previous)
            keys.setdefault((table, key.group(2)), prose and not _HEADER.match(previous))
        previous = line
    return keys


def test_example_loads() -> None:
    cfg = Config.from_toml(EXAMPLE)
    assert cfg.baseline_url and cfg.speculative_url


def test_example_names_and_documents_every_setting() -> None:
    keys = documented_keys(EXAMPLE.read_text(encoding="utf-8"))
    expected = {
        (table, key)
        for table, fields in setting_fields().items()
        for key in fields
        if (table, key) not in INTERNAL
    }
    assert set(keys) == expected, (expected - set(keys), set(keys) - expected)
    undocumented = sorted(str(k) for k, documented in keys.items() if not documented)
    assert undocumented == []


def test_example_states_the_defaults() -> None:
    data = tomllib.loads(EXAMPLE.read_text(encoding="utf-8"))
    loaded = Config.from_mapping(data)
    defaults = Config.from_mapping({key: data[key] for key in REQUIRED})
    assert loaded == defaults, [
        f.name
        for f in dataclasses.fields(Config)
        if getattr(loaded, f.name) != getattr(defaults, f.name)
    ]


def test_the_checks_catch_an_undocumented_or_missing_setting() -> None:
    text = EXAMPLE.read_text(encoding="utf-8")
    stripped = text.replace("# Records written per batch.\n", "")
    assert documented_keys(stripped)[("store", "batch_size")] is False
    assert documented_keys(text)[("store", "batch_size")] is True
    dropped = text.replace("max_buffer = 200000\n", "")
    assert ("store", "max_buffer") not in documented_keys(dropped)
