"""The admin API of arm control: reads, changes, bad input, who, and who may change at all."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpClient

from specproxy.app import create_app
from specproxy.appkeys import CONTROL, ROUTER, STORE
from specproxy.config import Config, ControlConfig, RoutingConfig, StoreConfig
from specproxy.control.api import MAX_BODY_BYTES
from specproxy.proxy.headers import REQUEST_ID_HEADER
from tests.test_app import config

TOKEN = "0123456789abcdef0123"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def basic(user: str, password: str) -> dict[str, str]:
    raw = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {raw}"}


def control_config(tmp_path: Path, url: str = "memory://", **control: Any) -> Config:
    base = config()
    return Config(
        baseline_url=base.baseline_url,
        speculative_url=base.speculative_url,
        run_id="run",
        routing=RoutingConfig(speculative_share=0.5),
        store=StoreConfig(url=url, spill_path=str(tmp_path / "spill.jsonl")),
        control=ControlConfig(**control),
    )


def control_app(
    cfg: Config, *, token: str | None = None, remote: str | None = None
) -> web.Application:
    app = create_app(cfg, registry=CollectorRegistry(), admin_token=token, with_stats=False)
    if remote is not None:  # the client seen from elsewhere (the test client is on loopback)

        @web.middleware
        async def from_elsewhere(request: web.Request, handler: Handler) -> web.StreamResponse:
            return await handler(request.clone(remote=remote))

        app.middlewares.insert(0, from_elsewhere)
    return app


async def _json(resp: Any) -> Any:
    return await resp.json()


async def test_set_pause_resume_stop_start_through_the_api(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = control_app(control_config(tmp_path))
    client = await aiohttp_client(app)
    resp = await client.get("/api/arms")
    assert resp.status == 200 and resp.headers[REQUEST_ID_HEADER]
    view = await resp.json()
    assert [(a["name"], a["role"], a["share"]) for a in view["arms"]] == [
        ("speculative", "treatment", 0.5),
        ("baseline", "control", 0.5),
    ]
    resp = await client.post(
        "/api/arms/speculative", json={"action": "set", "weight": 0.1, "why": "ramp down"}
    )
    assert resp.status == 200
    doc = await resp.json()
    assert doc["event"]["weight"] == 0.1 and doc["event"]["who"] == "admin"
    assert doc["arms"][0]["share"] == 0.1 and doc["arms"][1]["share"] == pytest.approx(0.9)
    assert app[ROUTER].share == 0.1  # applied at once by the replica that took it
    for body, share in (
        ({"action": "pause"}, 0.0),
        ({"action": "resume"}, 0.1),
    ):
        resp = await client.post("/api/arms/speculative", json=body)
        assert resp.status == 200 and app[ROUTER].share == share
    resp = await client.post("/api/experiment", json={"action": "stop", "why": "p99 alert"})
    assert resp.status == 200 and (await resp.json())["stopped"]
    assert app[ROUTER].share == 0.0
    resp = await client.post("/api/experiment", json={"action": "start"})
    assert app[ROUTER].share == 0.1
    view = await (await client.get("/api/arms")).json()
    assert [e["action"] for e in view["events"]] == ["set", "pause", "resume", "stop", "start"]
    stored = await app[STORE].arm_events(run_id="run")
    assert [e.id for e in stored] == [e["id"] for e in view["events"]]  # each stored once
    metrics = await (await client.get("/metrics")).text()
    assert 'specproxy_arm_weight_ratio{arm="speculative"} 0.1' in metrics
    assert "specproxy_experiment_stopped 0.0" in metrics


@pytest.mark.parametrize(
    ("path", "body", "status", "param"),
    [
        ("/api/arms/speculative", b"{not json", 400, None),
        ("/api/arms/speculative", b'{"action": "set", "weight": 2}', 400, "weight"),
        ("/api/arms/speculative", b'{"action": "set"}', 400, "weight"),
        ("/api/arms/speculative", b'{"action": "jump"}', 400, "action"),
        ("/api/arms/speculative", b'{"action": "pause", "extra": 1}', 400, "extra"),
        ("/api/arms/baseline", b'{"action": "set", "weight": 0.5}', 404, "name"),
        ("/api/arms/nope", b'{"action": "pause"}', 404, "name"),
        ("/api/experiment", b'{"action": "pause"}', 400, "action"),
        ("/api/experiment", b"[]", 400, None),
        ("/api/experiment", b"[" * 3000, 400, None),  # deeper than json's recursion
        (
            "/api/experiment",
            b'{"action": "stop", "why": "' + b"x" * MAX_BODY_BYTES + b'"}',
            413,
            None,
        ),
    ],
)
async def test_bad_input_gets_an_openai_error_and_changes_nothing(
    aiohttp_client: AiohttpClient,
    tmp_path: Path,
    path: str,
    body: bytes,
    status: int,
    param: str | None,
) -> None:
    app = control_app(control_config(tmp_path))
    client = await aiohttp_client(app)
    resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    assert resp.status == status
    assert resp.headers[REQUEST_ID_HEADER]
    error = (await resp.json())["error"]
    assert error["code"] == status and error["message"]
    if status == 400:
        assert error["param"] == param
    assert await app[STORE].arm_events(run_id="run") == []
    assert app[ROUTER].share == 0.5


async def test_a_change_that_cannot_be_stored_is_refused_and_not_applied(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = control_app(control_config(tmp_path))
    client = await aiohttp_client(app)
    app[STORE].fail_writes = True  # type: ignore[attr-defined]
    resp = await client.post("/api/experiment", json={"action": "stop"})
    assert resp.status == 503
    assert "nothing changed" in (await resp.json())["error"]["message"]
    assert app[ROUTER].share == 0.5 and not app[CONTROL].state.stopped


async def test_with_a_token_changes_need_it_and_basic_names_who(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = control_app(control_config(tmp_path), token=TOKEN, remote="203.0.113.7")
    client = await aiohttp_client(app)
    assert (await client.get("/api/arms")).status == 401
    assert (await client.post("/api/experiment", json={"action": "stop"})).status == 401
    resp = await client.post(
        "/api/experiment", json={"action": "stop"}, headers={"Authorization": "Bearer wrong"}
    )
    assert resp.status == 401 and app[ROUTER].share == 0.5
    resp = await client.post(
        "/api/arms/speculative", json={"action": "pause"}, headers=basic("alice", TOKEN)
    )
    assert resp.status == 200 and (await resp.json())["event"]["who"] == "alice"
    resp = await client.post("/api/arms/speculative", json={"action": "resume"}, headers=BEARER)
    assert resp.status == 200 and (await resp.json())["event"]["who"] == "admin"
    resp = await client.post(
        "/api/arms/speculative", json={"action": "pause"}, headers=basic("x" * 65, TOKEN)
    )
    assert resp.status == 400 and (await resp.json())["error"]["param"] == "authorization"
    assert (await client.get("/api/arms", headers=BEARER)).status == 200


async def test_without_a_token_only_loopback_clients_may_change(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    remote = control_app(control_config(tmp_path), remote="203.0.113.7")
    client: TestClient[web.Request, web.Application] = await aiohttp_client(remote)
    assert (await client.get("/api/arms")).status == 200  # reading stays open, as /api/stats
    resp = await client.post("/api/experiment", json={"action": "stop"})
    assert resp.status == 403
    assert "SPECPROXY_ADMIN_TOKEN" in (await resp.json())["error"]["message"]
    assert not remote[CONTROL].state.stopped
    local = control_app(control_config(tmp_path / "local"))
    client = await aiohttp_client(local)
    assert (await client.post("/api/experiment", json={"action": "stop"})).status == 200
    assert local[CONTROL].state.stopped


async def test_without_a_store_the_api_says_so(aiohttp_client: AiohttpClient) -> None:
    from specproxy.proxy.recorder import MemoryRecorder

    app = create_app(
        config(),
        registry=CollectorRegistry(),
        recorder=MemoryRecorder(),
        with_store=False,
        with_stats=False,
    )
    client = await aiohttp_client(app)
    assert (await client.get("/api/arms")).status == 503
    resp = await client.post("/api/experiment", json={"action": "stop"})
    assert resp.status == 503 and (await resp.json())["error"]["type"] == "ServiceUnavailable"


async def test_a_chunked_body_is_read_whole_and_bounded(
    aiohttp_client: AiohttpClient, tmp_path: Path
) -> None:
    app = control_app(control_config(tmp_path))
    client = await aiohttp_client(app)

    async def chunks(*parts: bytes) -> AsyncIterator[bytes]:
        for part in parts:
            yield part

    huge = chunks(b'{"action": "stop", "why": "', b"x" * MAX_BODY_BYTES, b'"}')
    resp = await client.post("/api/experiment", data=huge)
    assert resp.status == 413 and not app[CONTROL].state.stopped
    small = chunks(b'{"action": ', b'"stop", "why": "in', b' pieces"}')
    resp = await client.post("/api/experiment", data=small)
    assert resp.status == 200 and (await resp.json())["event"]["why"] == "in pieces"
