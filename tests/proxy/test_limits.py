"""Client-controlled bounds: JSON depth, header bytes and count, methods, each with its answer."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specproxy.metrics import REJECTED
from specproxy.proxy.limits import (
    MAX_HEADER_BYTES,
    MAX_HEADERS,
    MAX_JSON_DEPTH,
    header_rejection,
    json_too_deep,
)
from tests.proxy.conftest import CHAT, Arms, MakeProxy, chat

# ---- pure checks -------------------------------------------------------------------------------


def _depth(doc: Any) -> int:
    """Reference: nesting depth of arrays/objects, recursively (top level 1, scalars 0)."""
    if isinstance(doc, dict):
        return 1 + max((_depth(v) for v in doc.values()), default=0)
    if isinstance(doc, list):
        return 1 + max((_depth(v) for v in doc), default=0)
    return 0


def _nested(depth: int) -> bytes:
    """An object whose innermost value is `depth` levels deep (the top level counting 1)."""
    return b'{"a":' * (depth - 1) + b"[]" + b"}" * (depth - 1)


json_docs = st.recursive(
    st.none() | st.integers() | st.text(alphabet="[]{}x", max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2), inner),
    max_leaves=60,
)


@given(json_docs, st.integers(min_value=1, max_value=12))
def test_depth_check_agrees_with_a_recursive_walk(doc: Any, limit: int) -> None:
    body = json.dumps(doc).encode()
    assert json_too_deep(body, doc, limit) == (_depth(doc) > limit)


def test_depth_bound_is_exact() -> None:
    for depth, deep in ((MAX_JSON_DEPTH, False), (MAX_JSON_DEPTH + 1, True)):
        body = _nested(depth)
        assert _depth(json.loads(body)) == depth
        assert json_too_deep(body, json.loads(body)) is deep


def test_header_bounds() -> None:
    assert header_rejection([(b"a", b"b")] * MAX_HEADERS) is None
    assert "101 header fields" in (header_rejection([(b"a", b"b")] * (MAX_HEADERS + 1)) or "")
    fits = [(b"x-big", b"v" * (MAX_HEADER_BYTES - 5))]
    assert header_rejection(fits) is None
    assert "bytes" in (header_rejection([*fits, (b"x", b"")]) or "")


# ---- through the proxy -------------------------------------------------------------------------


async def _error(resp: Any, status: int) -> dict[str, Any]:
    assert resp.status == status
    assert resp.headers["Content-Type"].startswith("application/json")
    assert resp.headers["x-specproxy-request-id"]
    error: dict[str, Any] = (await resp.json())["error"]
    assert error["code"] == status and error["message"]
    return error


async def test_deep_json_is_a_400_with_a_request_id_counted_and_not_logged(
    make_proxy: MakeProxy, arms: Arms, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = await make_proxy()
    caplog.set_level(logging.DEBUG)
    bodies = [
        b"[" * 100_000 + b"]" * 100_000,  # json.loads raises RecursionError
        b'{"model": "m", "x": ' + b"[" * 2000 + b"]" * 2000 + b"}",  # parses; far past the bound
        _nested(MAX_JSON_DEPTH + 1),  # one level too many
    ]
    for raw in bodies:
        async with proxy.client.post(CHAT, data=raw) as resp:
            error = await _error(resp, 400)
            assert error["type"] == "BadRequestError" and "deeper" in error["message"]
    assert proxy.sample(REJECTED + "_total", {"reason": "json_too_deep"}) == len(bodies)
    assert not proxy.recorder.records and not arms.speculative.seen and not arms.baseline.seen
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


async def test_json_at_the_depth_bound_is_forwarded(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy()
    inner: Any = []
    for _ in range(MAX_JSON_DEPTH - 2):
        inner = [inner]
    async with proxy.client.post(CHAT, json=chat(tool_schema=inner)) as resp:
        assert resp.status == 200
    assert len(proxy.recorder.records) == 1


@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "PROPFIND"])
async def test_methods_vllm_does_not_serve_get_405(
    make_proxy: MakeProxy, arms: Arms, method: str
) -> None:
    proxy = await make_proxy()
    for path in ("/v1/models", CHAT, "/v1/anything"):
        async with proxy.client.request(method, path, data=b"{}") as resp:
            error = await _error(resp, 405)
            assert error["type"] == "MethodNotAllowed"
            assert resp.headers["Allow"] == "GET, HEAD, POST"
    assert proxy.sample(REJECTED + "_total", {"reason": "method_not_allowed"}) == 3
    assert not arms.baseline.seen and not arms.speculative.seen  # nothing was forwarded


async def test_too_many_header_bytes_or_fields_get_431(make_proxy: MakeProxy, arms: Arms) -> None:
    proxy = await make_proxy()
    spread = {f"x-pad-{i}": "v" * 50_000 for i in range(20)}  # 1 MB over 20 headers
    many = {f"x-h-{i}": "v" for i in range(MAX_HEADERS + 1)}
    for headers in (spread, many):
        async with proxy.client.post(CHAT, json=chat(), headers=headers) as resp:
            error = await _error(resp, 431)
            assert error["type"] == "RequestHeaderFieldsTooLarge"
        async with proxy.client.get("/v1/models", headers=headers) as resp:
            await _error(resp, 431)
    assert proxy.sample(REJECTED + "_total", {"reason": "headers_too_large"}) == 4
    assert not arms.baseline.seen and not arms.speculative.seen
    assert not proxy.recorder.records
    # Within the bounds, the same kind of request goes through.
    fits = {f"x-pad-{i}": "v" * 1000 for i in range(20)}
    async with proxy.client.post(CHAT, json=chat(), headers=fits) as resp:
        assert resp.status == 200
