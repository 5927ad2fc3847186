"""Upstream timeouts suited to LLM generation: stream silence, non-stream and stream deadlines,
per arm. Lower bounds only (a deadline is never early); what a late one would do is bounded by
the test's own timeout, never asserted as a speed."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import aiohttp
import pytest

from specproxy.config import Config, TimeoutConfig
from specproxy.proxy.timeouts import ArmTimeouts
from tests.faults.upstream import FaultUpstream
from tests.proxy.conftest import CHAT, SPEC_ONLY, MakeProxy, chat

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
async def faulty() -> AsyncIterator[FaultUpstream]:
    async with FaultUpstream() as upstream:
        yield upstream


def test_defaults_and_per_arm_overrides() -> None:
    cfg = Config.from_mapping(
        {
            "baseline_url": "http://b:8000",
            "speculative_url": "http://s:8000",
            "timeouts": {"read_s": 30, "speculative": {"total_s": 900}},
        }
    )
    spec, base = cfg.timeouts.for_arm("speculative"), cfg.timeouts.for_arm("baseline")
    assert (spec.read_s, spec.total_s, base.read_s, base.total_s) == (30, 900, 30, 600)
    assert TimeoutConfig() == TimeoutConfig(
        connect_s=5.0, read_s=120.0, total_s=600.0, stream_total_s=3600.0
    )
    stream, call = ArmTimeouts.of(spec).stream, ArmTimeouts.of(spec).call
    assert (stream.sock_read, stream.total) == (30, 3600.0)
    assert (call.sock_read, call.total) == (None, 900)  # silent until done: only the deadline


async def test_non_stream_slow_drip_meets_the_deadline(
    make_proxy: MakeProxy, faulty: FaultUpstream
) -> None:
    """Before: read_s bounded only silence, so a body dripping a byte every 50 ms held the client
    for ever. Now the whole answer has a deadline: 504, recorded as a timeout."""
    proxy = await make_proxy(
        routing=SPEC_ONLY, speculative_url=faulty.url, timeouts={"total_s": 0.5}
    )
    started = time.perf_counter()
    async with proxy.client.post(CHAT, json=chat(), headers={"x-fault": "drip_body"}) as resp:
        assert resp.status == 504
        assert (await resp.json())["error"]["type"] == "GatewayTimeout"
    assert time.perf_counter() - started >= 0.5
    (rec,) = proxy.recorder.records
    assert rec.status == 504 and rec.error_kind == "timeout"


async def test_stream_silence_before_headers_is_504(
    make_proxy: MakeProxy, faulty: FaultUpstream
) -> None:
    proxy = await make_proxy(
        routing=SPEC_ONLY, speculative_url=faulty.url, timeouts={"read_s": 0.3}
    )
    headers = {"x-fault": "stall_before_headers"}
    async with proxy.client.post(CHAT, json=chat(stream=True), headers=headers) as resp:
        assert resp.status == 504
    (rec,) = proxy.recorder.records
    assert rec.error_kind == "timeout" and rec.status == 504


@pytest.mark.parametrize(
    ("fault", "timeouts"),
    [
        ("stall_mid_stream", {"read_s": 0.3}),  # silence mid-stream
        ("drip", {"read_s": 10.0, "stream_total_s": 0.5}),  # never silent: the stream's cap
    ],
)
async def test_stream_cut_by_silence_or_cap(
    make_proxy: MakeProxy, faulty: FaultUpstream, fault: str, timeouts: dict[str, float]
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY, speculative_url=faulty.url, timeouts=timeouts)
    started = time.perf_counter()
    async with proxy.client.post(CHAT, json=chat(stream=True), headers={"x-fault": fault}) as resp:
        assert resp.status == 200  # the headers were relayed before the upstream failed
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()  # cut off the way the upstream failed: no synthetic end
    assert time.perf_counter() - started >= min(timeouts.values())
    (rec,) = proxy.recorder.records
    assert rec.status == 200 and rec.error_kind == "timeout"


async def test_per_arm_deadline_applies_to_its_arm_only(
    make_proxy: MakeProxy, faulty: FaultUpstream
) -> None:
    proxy = await make_proxy(
        routing={"allow_forced_arm": True},
        speculative_url=faulty.url,
        baseline_url=faulty.url,
        timeouts={"total_s": 1.5, "speculative": {"total_s": 0.3}},
    )
    took = {}
    for arm in ("speculative", "baseline"):
        started = time.perf_counter()
        headers = {"x-fault": "drip_body", "x-specproxy-arm": arm}
        async with proxy.client.post(CHAT, json=chat(), headers=headers) as resp:
            assert resp.status == 504
        took[arm] = time.perf_counter() - started
    assert took["speculative"] >= 0.3 and took["baseline"] >= 1.5
    assert [r.error_kind for r in proxy.recorder.records] == ["timeout", "timeout"]
