"""The request lifecycle end to end: routing, records, failure mapping, pass-through."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from scipy.stats import binomtest

from specproxy.config import ArmConfig, OutlierConfig
from specproxy.metrics import ARM, ARM_UP, OUTPUT_TOKENS, REQUESTS, REROUTED, UPSTREAM_ERRORS
from specproxy.records import RerouteReason
from specproxy.summary.minute import rollup_records
from tests.conftest import fixture_path
from tests.proxy.conftest import CHAT, SPEC_ONLY, Arms, MakeProxy, chat


@pytest.mark.parametrize(("arm", "fixture"), [("speculative", "spec"), ("baseline", "baseline")])
async def test_non_stream_body_and_record(make_proxy: MakeProxy, arm: str, fixture: str) -> None:
    proxy = await make_proxy(routing={"speculative_share": 1.0 if arm == "speculative" else 0.0})
    async with proxy.client.post(CHAT, json=chat()) as resp:
        got = await resp.read()
        assert resp.status == 200
        assert resp.headers["x-specproxy-arm"] == arm
        request_id = resp.headers["x-specproxy-request-id"]
    payload = fixture_path(f"chat_nonstream_{fixture}.json").read_bytes()
    assert got == payload
    rec = proxy.recorder.records[-1]
    assert rec.request_id == request_id and rec.arm == arm and not rec.stream
    usage = json.loads(payload)["usage"]
    assert rec.output_tokens == usage["completion_tokens"]
    assert rec.ttft_s is None and rec.e2e_s >= rec.upstream_s > 0
    if arm == "speculative":
        assert rec.acceptance_rate == 1.0
    assert proxy.sample(REQUESTS + "_total", {"arm": arm, "status": "200"}) == 1
    assert proxy.sample(OUTPUT_TOKENS + "_count", {"arm": arm}) == 1


async def test_weighted_shares_through_the_proxy(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 0.3, "seed": 11})
    n = 300
    arms = []
    for _ in range(n):
        async with proxy.client.post(CHAT, json=chat()) as resp:
            arms.append(resp.headers["x-specproxy-arm"])
    hits = arms.count("speculative")
    assert binomtest(hits, n, 0.3).pvalue > 1e-3
    assert len(proxy.recorder.records) == n


async def test_sticky_header_and_user_through_the_proxy(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"mode": "sticky", "sticky_header": "x-tenant"})
    seen: dict[str, set[str]] = {}
    for i in range(40):
        key = f"tenant-{i % 8}"
        async with proxy.client.post(CHAT, json=chat(), headers={"x-tenant": key}) as resp:
            seen.setdefault(key, set()).add(resp.headers["x-specproxy-arm"])
    assert all(len(arms) == 1 for arms in seen.values())
    by_user = await make_proxy(routing={"mode": "sticky", "sticky_source": "user"})
    for user in ("alice", "bob", "carol"):
        got = set()
        for _ in range(5):
            async with by_user.client.post(CHAT, json=chat(user=user)) as resp:
                got.add(resp.headers["x-specproxy-arm"])
        assert len(got) == 1


async def test_forced_arm(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 1.0, "allow_forced_arm": True})
    async with proxy.client.post(CHAT, json=chat(), headers={"x-specproxy-arm": "baseline"}) as r:
        assert r.headers["x-specproxy-arm"] == "baseline"
        assert r.headers["x-fake-arm"] == "baseline"
    async with proxy.client.post(CHAT, json=chat(), headers={"x-specproxy-arm": "nope"}) as r:
        assert r.status == 400
        assert (await r.json())["error"]["param"] == "x-specproxy-arm"


async def test_upstream_refused_is_502(make_proxy: MakeProxy) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    # on_down = "error": the arm's own failure reaches the client (no failing open)
    proxy = await make_proxy(
        routing=SPEC_ONLY, speculative_url=closed, speculative=ArmConfig(on_down="error")
    )
    async with proxy.client.post(CHAT, json=chat(stream=True)) as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
        assert error["code"] == 502 and error["type"] == "BadGateway"
        assert resp.headers["x-specproxy-arm"] == "speculative"
    rec = proxy.recorder.records[-1]
    assert rec.status == 502 and rec.error_kind == "connect"
    assert proxy.sample(UPSTREAM_ERRORS + "_total", {"arm": "speculative", "kind": "connect"}) == 1


async def test_upstream_timeout_is_504(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY, timeouts={"total_s": 0.2})  # non-stream deadline
    async with proxy.client.post(CHAT, json=chat(), headers={"x-fake-mode": "hang"}) as resp:
        assert resp.status == 504
        assert (await resp.json())["error"]["type"] == "GatewayTimeout"
    rec = proxy.recorder.records[-1]
    assert rec.status == 504 and rec.error_kind == "timeout"


async def test_upstream_error_passes_through_unchanged(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.post(CHAT, json=chat(), headers={"x-fake-mode": "error404"}) as resp:
        assert resp.status == 404
        assert await resp.read() == fixture_path("error_unknown_model.json").read_bytes()
    rec = proxy.recorder.records[-1]
    assert rec.status == 404 and rec.error_kind == "http_4xx"


async def test_client_disconnect_cancels_upstream_and_is_recorded(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    url = proxy.server.make_url(CHAT)
    async with aiohttp.ClientSession() as session:
        resp = await session.post(url, json=chat(stream=True), headers={"x-fake-mode": "slow"})
        await resp.content.readany()
        resp.close()  # drop the connection mid-stream
    for _ in range(200):
        if arms.speculative.aborted and proxy.recorder.records:
            break
        await asyncio.sleep(0.01)
    assert arms.speculative.aborted == 1 and arms.speculative.completed == 0
    rec = proxy.recorder.records[-1]
    assert rec.disconnected and rec.error_kind == "disconnected"
    assert len(proxy.recorder.records) == 1


async def test_passthrough_goes_to_baseline_and_is_not_measured(
    arms: Arms, make_proxy: MakeProxy
) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.get("/v1/models") as resp:
        assert resp.status == 200
        assert await resp.read() == fixture_path("models.json").read_bytes()
        assert resp.headers["x-specproxy-arm"] == "baseline"
    assert arms.baseline.seen[-1]["path"] == "/v1/models"
    assert not proxy.recorder.records
    async with proxy.client.get("/admin") as resp:
        assert resp.status == 404


async def test_bad_bodies_get_openai_style_errors(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(max_body_bytes=1000)
    cases = [(b"{not json", 400), (b"[1, 2]", 400), (b'{"p": "' + b"x" * 2000 + b'"}', 413)]
    for raw, status in cases:
        async with proxy.client.post(CHAT, data=raw) as resp:
            assert resp.status == status
            error = (await resp.json())["error"]
            assert error["code"] == status and error["message"]
            assert resp.headers["x-specproxy-request-id"]
    assert not proxy.recorder.records


def _closed_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_treatment_that_cannot_be_reached_fails_open_to_the_control(
    make_proxy: MakeProxy,
) -> None:
    proxy = await make_proxy(
        routing={**SPEC_ONLY, "mirror_fraction": 1.0},
        speculative_url=_closed_url(),
        outlier=OutlierConfig(eject_after_failures=2),
    )
    for _ in range(4):
        async with proxy.client.post(CHAT, json=chat(stream=True)) as resp:
            assert resp.status == 200  # no error caused by the experiment
            assert resp.headers["x-specproxy-arm"] == "baseline"  # who actually answered
            assert resp.headers["x-fake-arm"] == "baseline"
            await resp.read()
    records = proxy.recorder.records
    primaries = [r for r in records if not r.shadow]
    assert [r.arm for r in primaries] == ["baseline"] * 4
    assert all(r.rerouted_from == "speculative" and r.status == 200 for r in primaries)
    # Two refused connections ejected the one endpoint: then the arm is down, never tried.
    assert [r.reroute_reason for r in primaries] == [RerouteReason.CONNECT] * 2 + [
        RerouteReason.DOWN
    ] * 2
    assert all(r.pair_id is None for r in primaries)  # no pair with its own shadow
    shadows = [r for r in records if r.shadow]
    assert len(shadows) == 2 and all(r.arm == "baseline" for r in shadows)  # before the arm
    # was known to be down; then the mirror is skipped
    assert proxy.sample("specproxy_shadow_skipped_total") == 2
    assert rollup_records(records).summaries == []  # kept out of the comparison
    labels = {"from": "speculative", "to": "baseline"}
    assert proxy.sample(REROUTED + "_total", {**labels, "reason": "connect"}) == 2
    assert proxy.sample(REROUTED + "_total", {**labels, "reason": "down"}) == 2
    assert proxy.sample(ARM_UP, {"arm": "speculative"}) == 0
    assert proxy.sample(ARM_UP, {"arm": "baseline"}) == 1
    assert proxy.sample("specproxy_request_duration_seconds_count") == 0  # no latency sample


async def test_the_control_never_fails_over_to_a_treatment(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 0.0}, baseline_url=_closed_url())
    async with proxy.client.post(CHAT, json=chat()) as resp:
        assert resp.status == 502
        assert resp.headers["x-specproxy-arm"] == "baseline"
    rec = proxy.recorder.records[-1]
    assert rec.arm == "baseline" and rec.rerouted_from is None and rec.error_kind == "connect"


async def test_each_arm_is_exported_with_its_role(make_proxy: MakeProxy) -> None:
    """specproxy_arm_info{arm,role}: the alerts find the control by role, not by its name."""
    proxy = await make_proxy()
    assert proxy.sample(ARM + "_info", {"arm": "baseline", "role": "control"}) == 1
    assert proxy.sample(ARM + "_info", {"arm": "speculative", "role": "treatment"}) == 1
    assert proxy.sample(ARM + "_info", {"arm": "baseline", "role": "treatment"}) == 0  # none
