"""The access log: one JSON line per request (a 502 and a rejection included), bounded in rate
per kind, off by default."""

from __future__ import annotations

import json
import socket

import pytest

from specproxy.config import ArmConfig, TelemetryConfig
from specproxy.errors import ErrorKind
from specproxy.proxy.accesslog import AccessLog
from specproxy.records import SHORTHAND_TREATMENT, RequestRecord
from tests.proxy.conftest import CHAT, SPEC_ONLY, MakeProxy, chat


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(status: int = 200, kind: ErrorKind | None = None, i: int = 0) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{i}",
        run_id="run",
        arm=SHORTHAND_TREATMENT,
        t_start=0.0,
        model="m",
        endpoint="chat.completions",
        stream=True,
        status=status,
        e2e_s=0.25,
        upstream_s=0.2,
        ttft_s=0.05,
        error_kind=kind,
    )


def test_a_line_carries_the_request_and_the_time_in_utc() -> None:
    lines: list[str] = []
    log = AccessLog(10, emit=lines.append, clock=Clock(), wall=lambda: 1_800_000_000.5)
    log.request(record())
    (line,) = [json.loads(x) for x in lines]
    assert line == {
        "time": "2027-01-15T08:00:00.500Z",
        "log": "access",
        "request_id": "r0",
        "arm": "speculative",
        "endpoint": "chat.completions",
        "model": "m",
        "stream": True,
        "status": 200,
        "e2e_s": 0.25,
        "ttft_s": 0.05,
        "error_kind": None,
    }


def test_the_rate_is_bounded_per_kind_and_drops_are_counted() -> None:
    lines: list[str] = []
    clock = Clock()
    log = AccessLog(5, emit=lines.append, clock=clock)
    for i in range(20):  # a burst of answered requests: 5 lines (one second's worth)
        log.request(record(i=i))
    assert len(lines) == 5
    log.request(record(502, ErrorKind.CONNECT, i=99))  # an error still gets its line
    assert json.loads(lines[-1])["error_kind"] == "connect" and len(lines) == 6
    clock.now += 1.0  # a second later the bucket is full again
    log.request(record(i=100))
    last = json.loads(lines[-1])
    assert last["request_id"] == "r100" and last["dropped"] == 15
    log.request(record(i=101))
    assert "dropped" not in json.loads(lines[-1])


def test_below_one_line_a_second_a_line_is_written_every_1_over_rate_seconds() -> None:
    lines: list[str] = []
    clock = Clock()
    log = AccessLog(0.25, emit=lines.append, clock=clock)
    for i in range(17):  # one request a second for 16 s
        log.request(record(i=i))
        clock.now += 1.0
    assert [json.loads(x)["request_id"] for x in lines] == ["r0", "r4", "r8", "r12", "r16"]
    assert [json.loads(x).get("dropped") for x in lines] == [None, 3, 3, 3, 3]


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def test_a_502_and_a_rejection_leave_a_line_each(
    make_proxy: MakeProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = await make_proxy(
        routing=SPEC_ONLY,
        speculative_url=closed_port_url(),
        speculative=ArmConfig(on_down="error"),
        telemetry=TelemetryConfig(access_log=True),
    )
    async with proxy.client.post(CHAT, json=chat()) as resp:
        assert resp.status == 502
    async with proxy.client.post(CHAT, data=b"{not json") as resp:
        assert resp.status == 400
        rejected_id = resp.headers["x-specproxy-request-id"]
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if '"access"' in x]
    failed, rejected = lines
    assert failed["status"] == 502 and failed["error_kind"] == "connect"
    assert failed["arm"] == "speculative" and failed["ttft_s"] is None
    assert failed["request_id"] == proxy.recorder.records[-1].request_id
    assert rejected == {
        "time": rejected["time"],
        "log": "access",
        "request_id": rejected_id,
        "status": 400,
        "rejected": "invalid_json",
    }


async def test_forwarded_calls_and_refused_ones_leave_a_line_each(
    make_proxy: MakeProxy, capsys: pytest.CaptureFixture[str]
) -> None:
    """Any other /v1/* call is forwarded to the control unmeasured: its line has its path; one
    to a control that refuses is a 502 with its error kind; a 400 for an unknown forced arm (no
    limit's rejection) has its line too."""
    proxy = await make_proxy(
        routing={"allow_forced_arm": True}, telemetry=TelemetryConfig(access_log=True)
    )
    async with proxy.client.get("/v1/models?secret=1") as resp:
        assert resp.status == 200
        models_id = resp.headers["x-specproxy-request-id"]
    async with proxy.client.post(CHAT, json=chat(), headers={"x-specproxy-arm": "nope"}) as resp:
        assert resp.status == 400
        forced_id = resp.headers["x-specproxy-request-id"]
    dead = await make_proxy(
        baseline_url=closed_port_url(), telemetry=TelemetryConfig(access_log=True)
    )
    async with dead.client.get("/v1/models") as resp:
        assert resp.status == 502
        dead_id = resp.headers["x-specproxy-request-id"]
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if '"access"' in x]
    models, forced, failed = lines
    assert models == {
        "time": models["time"],
        "log": "access",
        "request_id": models_id,
        "arm": "baseline",
        "path": "/v1/models",  # never the query
        "status": 200,
        "e2e_s": models["e2e_s"],
        "error_kind": None,
    }
    assert models["e2e_s"] > 0
    assert forced["request_id"] == forced_id and forced["status"] == 400
    assert forced["rejected"] == "bad_request"
    assert failed["request_id"] == dead_id and failed["arm"] == "baseline"
    assert failed["status"] == 502 and failed["error_kind"] == "connect"


async def test_off_by_default(make_proxy: MakeProxy, capsys: pytest.CaptureFixture[str]) -> None:
    proxy = await make_proxy(routing=SPEC_ONLY)
    async with proxy.client.post(CHAT, json=chat()) as resp:
        assert resp.status == 200
    assert '"access"' not in capsys.readouterr().err
