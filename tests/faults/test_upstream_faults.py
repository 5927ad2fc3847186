"""Faulty upstreams, one request at a time: what the client gets, one record per request with
the right error_kind, never a usable sample, nothing lost, bounded memory."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from specproxy.metrics import REJECTED
from tests.faults.conftest import RUN, MakeRig, MiB, fault_row, rss_bytes
from tests.faults.serve_proc import Serve, serve_toml, stored_rows
from tests.faults.upstream import HUGE_BYTES, FaultUpstream
from tests.proxy.conftest import CHAT, chat

pytestmark = pytest.mark.timeout(120)

REQUESTS = 3  # per case: one record per request, not one per case

# fault, stream, status the client gets, body cut off mid-way, error_kind recorded
CASES = [
    ("refuse", False, 502, False, "connect"),
    ("refuse", True, 502, False, "connect"),
    ("reset_before_headers", False, 502, False, "broken"),
    ("reset_before_headers", True, 502, False, "broken"),
    ("reset_after_headers", True, 200, True, "broken"),
    ("reset_mid_stream", True, 200, True, "broken"),
    ("stall_before_headers", False, 504, False, "timeout"),
    ("stall_before_headers", True, 504, False, "timeout"),
    ("stall_mid_stream", True, 200, True, "timeout"),
    ("drip", True, 200, True, "timeout"),
    ("drip_body", False, 504, False, "timeout"),
    ("garbage_sse", True, 200, False, "malformed_stream"),
    ("truncated_chunked", False, 200, True, "broken"),
]


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def _send(client: Any, fault: str, stream: bool) -> tuple[int, bool, bytes]:
    """(status, cut off, body) as the client saw them."""
    async with client.post(CHAT, json=chat(stream=stream), headers={"x-fault": fault}) as resp:
        try:
            return resp.status, False, await resp.read()
        except aiohttp.ClientPayloadError:
            return resp.status, True, b""


@pytest.mark.parametrize(("fault", "stream", "status", "cut", "kind"), CASES)
async def test_fault(
    make_rig: MakeRig, fault: str, stream: bool, status: int, cut: bool, kind: str
) -> None:
    # a timeout case gets a short one (it fires however loaded the machine is); the others keep
    # the rig's generous ones, so that load never turns their answer into a timeout
    timeouts = {"read_s": 0.5, "total_s": 0.5} if kind == "timeout" else {}
    if fault == "drip":
        timeouts = {"read_s": 10.0, "stream_total_s": 0.5}
    spec = _closed_port_url() if fault == "refuse" else None
    # on_down = "error": the arm's own failure is the case here (failing open: test_fail_open)
    rig = await make_rig(speculative_url=spec, on_down="error", **timeouts)
    for _ in range(REQUESTS):
        got_status, got_cut, body = await _send(rig.client, fault, stream)
        rig.sent += 1
        assert (got_status, got_cut) == (status, cut)
        if status >= 500:  # the proxy's own answer: OpenAI-style, with the request id
            assert b'"error"' in body
    rows = await rig.check_records({kind})
    assert set(rows["status"]) == {status}
    rss_after = rss_bytes()
    assert rss_after - rig.rss_before < 64 * MiB
    seen = f"{status}{' cut off' if cut else ''}{' (stream)' if stream else ''}"
    fault_row(f"{fault}{' stream' if stream else ''}", seen, f"{REQUESTS} x {kind}", 0,
              rig.rss_before, rss_after)  # fmt: skip


async def test_5xx_burst(make_rig: MakeRig) -> None:
    """Fifty 503s in a row reach the client verbatim and are recorded as http_5xx."""
    rig = await make_rig()
    for _ in range(50):
        got_status, _, body = await _send(rig.client, "error_503", False)
        rig.sent += 1
        assert got_status == 503 and b"error" in body
    await rig.check_records({"http_5xx"})
    fault_row("5xx burst (50)", "503 verbatim", "50 x http_5xx", 0, rig.rss_before, rss_bytes())


async def test_100_mb_answer_streams_through_in_bounded_memory(make_rig: MakeRig) -> None:
    rig = await make_rig(total_s=120.0)
    received = 0
    async with rig.client.post(CHAT, json=chat(), headers={"x-fault": "huge_body"}) as resp:
        assert resp.status == 200
        async for chunk in resp.content.iter_any():
            received += len(chunk)
    rig.sent += 1
    rss_after = rss_bytes()
    assert received == HUGE_BYTES
    rows = await rig.check_records({None})
    assert list(rows["status"]) == [200]
    assert rss_after - rig.rss_before < 64 * MiB  # relayed as it came, never held whole
    fault_row("100 MB answer", "200, all bytes", "1 x ok", 0, rig.rss_before, rss_after)


@pytest.mark.parametrize("include_usage", [False, True], ids=["usage_stripped", "passthrough"])
async def test_100_mb_event_ends_the_stream_cleanly(make_rig: MakeRig, include_usage: bool) -> None:
    """One 100 MB SSE event: past `max_event_bytes` (1 MiB) the proxy closes the engine's
    stream, finishes the client's response properly and records `event_too_large`."""
    rig = await make_rig(total_s=120.0)
    body = chat(stream=True, stream_options={"include_usage": True}) if include_usage else None
    received = b""
    async with rig.client.post(
        CHAT, json=body or chat(stream=True), headers={"x-fault": "huge_event"}
    ) as resp:
        assert resp.status == 200
        async for chunk in resp.content.iter_any():  # to a clean end: no ClientPayloadError
            received += chunk
    rig.sent += 1
    rss_after = rss_bytes()
    assert b"[DONE]" not in received
    # Stripping usage holds the open event (dropped); passing through relays what came.
    assert len(received) <= (2 * MiB if include_usage else 0)
    rows = await rig.check_records({"event_too_large"})
    assert list(rows["status"]) == [200]
    for _ in range(1200):  # the engine side sees the close (a loaded machine only takes longer)
        if rig.upstream.aborted:
            break
        await asyncio.sleep(0.05)
    assert rig.upstream.aborted == 1  # the engine's stream was closed, not read to its end
    assert rig.upstream.streamed < HUGE_BYTES // 4
    assert rss_after - rig.rss_before < 64 * MiB
    seen = f"200, {len(received) / MiB:.1f} MiB, clean end"
    fault_row(f"100 MB event ({'passthrough' if include_usage else 'usage stripped'})", seen,
              "1 x event_too_large", 0, rig.rss_before, rss_after)  # fmt: skip


async def test_a_real_serve_ends_a_100_mb_event_at_its_bound(
    faulty: FaultUpstream, tmp_path: Path
) -> None:
    """The 100 MB event against a real `specproxy serve` (its own peak RSS): the client's
    response ends cleanly without `[DONE]`, the record says `event_too_large`, and the process
    never held the event (peak +3 MiB on the 2-core build machine; without the bound it peaked
    310 MiB higher, held the client's first byte for seconds and recorded a usable 200)."""
    db = tmp_path / "store.db"
    serve = Serve(tmp_path, serve_toml(faulty.url, tmp_path, RUN))
    await serve.ready()
    rss_before = serve.rss_bytes()
    received = b""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            serve.url + CHAT, json=chat(stream=True), headers={"x-fault": "huge_event"}
        ) as resp,
    ):
        assert resp.status == 200
        async for chunk in resp.content.iter_any():  # to a clean end: no ClientPayloadError
            received += chunk
    peak = serve.peak_rss_bytes()
    serve.proc.terminate()
    assert await serve.wait() == 0
    assert b"[DONE]" not in received and len(received) <= 2 * MiB
    assert [(kind, status) for _, kind, status in stored_rows(db, RUN)] == [
        ("event_too_large", 200)
    ]
    assert peak - rss_before < 64 * MiB, (peak - rss_before) / MiB
    fault_row("100 MB event (serve, usage stripped)", f"200, {len(received)} B, clean end",
              "1 x event_too_large", 0, rss_before, peak)  # fmt: skip


async def _hundred_mb() -> AsyncIterator[bytes]:
    yield b'{"model": "m", "prompt": "'
    block = b"x" * MiB
    for _ in range(100):
        yield block
    yield b'"}'


async def test_100_mb_request_is_413_and_never_forwarded(make_rig: MakeRig) -> None:
    """Announced (Content-Length) or not (chunked): 413 once past max_body_bytes, never held."""
    rig = await make_rig()
    length = {"Content-Length": str(100 * MiB + 28), "Content-Type": "application/json"}
    for headers in (length, {"Content-Type": "application/json"}):
        try:
            async with rig.client.post(CHAT, data=_hundred_mb(), headers=headers) as resp:
                assert resp.status == 413
                assert resp.headers["x-specproxy-request-id"]
        except aiohttp.ClientConnectionError:
            pass  # the proxy answered 413 and closed while the client was still sending
    rss_after = rss_bytes()
    rejected = rig.registry.get_sample_value(REJECTED + "_total", {"reason": "body_too_large"})
    assert rejected == 2  # the proxy answered both with its 413
    assert sum(rig.upstream.requests.values()) == 0
    await rig.check_records(set())  # rejected by the proxy itself: no record
    assert rss_after - rig.rss_before < 64 * MiB
    fault_row("100 MB request", "413", "none (never forwarded)", 0, rig.rss_before, rss_after)
