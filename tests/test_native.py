"""The switch for the compiled modules: found when built, None when missing or switched off."""

from __future__ import annotations

import os

import pytest

from specproxy.native import NO_EXTENSIONS_ENV, compiled

MODULES = [
    ("specproxy.proxy._sse", "Scanner"),
    ("specproxy.proxy._usage", "object_after"),
    ("specproxy.proxy.transports._wire", "split_head"),
    ("specproxy.proxy.transports._wire", "take_chunked"),
]


@pytest.mark.parametrize(("module", "name"), MODULES)
def test_a_built_module_is_found_and_switched_off_by_the_environment(
    module: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(NO_EXTENSIONS_ENV, raising=False)
    found = compiled(module, name)
    if os.environ.get("SPECPROXY_REQUIRE_EXTENSIONS") == "1":  # `make test`: all are built
        assert found is not None
    if found is not None:
        assert callable(found)
    monkeypatch.setenv(NO_EXTENSIONS_ENV, "1")
    assert compiled(module, name) is None
    monkeypatch.setenv(NO_EXTENSIONS_ENV, "")  # empty: not set
    assert compiled(module, name) is found


def test_a_module_that_was_not_built_is_none() -> None:
    assert compiled("specproxy.proxy._never_built", "anything") is None
