"""Helpers for the emulator tests: fixture loading, SSE splitting and JSON shape comparison."""

from __future__ import annotations

import json
from typing import Any

from tests.conftest import fixture_path


def load_json(name: str) -> Any:
    return json.loads(fixture_path(name).read_text())


def sse_payloads(text: str) -> list[str]:
    """The `data:` payloads of an SSE body, asserting vLLM's framing on the way."""
    assert text.endswith("data: [DONE]\n\n"), text[-200:]
    frames = text.split("\n\n")
    assert frames[-1] == ""
    payloads = []
    for frame in frames[:-1]:
        assert frame.startswith("data: "), frame
        assert "\n" not in frame
        payloads.append(frame[len("data: ") :])
    return payloads


def fixture_events(name: str) -> list[dict[str, Any]]:
    payloads = sse_payloads(fixture_path(name).read_text())
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


def assert_same_shape(ours: Any, theirs: Any, path: str = "$") -> None:
    """Same keys in the same order and the same JSON types, recursively (list items against the
    fixture's first item); values may differ."""
    if isinstance(theirs, dict):
        assert isinstance(ours, dict), f"{path}: expected object, got {ours!r}"
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same_shape(ours[key], theirs[key], f"{path}.{key}")
    elif isinstance(theirs, list):
        assert isinstance(ours, list), f"{path}: expected list, got {ours!r}"
        if theirs:
            for i, item in enumerate(ours):
                assert_same_shape(item, theirs[0], f"{path}[{i}]")
    else:
        assert type(ours) is type(theirs), f"{path}: {ours!r} is not like {theirs!r}"
