"""One derivation of the per-request measurements, shared by the proxy and the load generator.

The pure tests pin each formula on virtual timestamps. The end-to-end test sends the same
recorded byte stream (real vLLM 0.32 streams, plus reasoning and tool-call streams built from
them in vLLM's framing) through the load generator *and* the proxy in front of it, and checks that
the two records agree on every field that does not depend on where the clock was read.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from pytest_aiohttp import AiohttpServer

from specproxy.app import create_app
from specproxy.config import Config
from specproxy.errors import ErrorKind
from specproxy.loadgen import LoadGenerator, RequestOptions, Target
from specproxy.prompts import Prompt
from specproxy.proxy.recorder import MemoryRecorder
from specproxy.proxy.sse import SSEScanner
from specproxy.records import RequestRecord, RerouteReason
from specproxy.timing import Measures, RequestTimings, derive
from tests.conftest import fixture_path

SPEC = {"draft_acceptance_rate": 0.5, "mean_acceptance_length": 3.0}


@dataclass
class _Events:
    first_content_at: float | None = None
    n_events: int = 0
    gaps: list[float] = field(default_factory=list)
    token_ids: int = 0
    token_ids_complete: bool = True
    usage: dict[str, Any] | None = None
    speculative: dict[str, Any] | None = None


def test_streamed_request_measures() -> None:
    events = _Events(
        first_content_at=10.25,
        n_events=3,
        gaps=[0.5, 0.25],
        usage={"prompt_tokens": 7, "completion_tokens": 9},
        speculative=SPEC,
    )
    timings = RequestTimings(
        request_start=10.0,
        upstream_start=10.125,
        upstream_end=11.0,
        request_end=11.25,
        status=200,
        events=events,
    )
    m = derive(timings, now=99.0)
    assert m.e2e_s == 1.25 and m.upstream_s == 0.875 and m.ttft_s == 0.25
    assert m.tpot_s == (1.25 - 0.25) / 8
    assert m.prompt_tokens == 7 and m.output_tokens == 9 and m.n_events == 3
    assert m.tokens_per_event == 3.0 and m.mean_gap_s == 0.375 and m.max_gap_s == 0.5
    assert m.acceptance_rate == 0.5 and m.mean_acceptance_length == 3.0
    assert m.status == 200 and m.error_kind is None and not m.disconnected


def test_token_ids_stand_in_for_usage_only_when_every_event_had_them() -> None:
    events = _Events(first_content_at=1.0, n_events=2, gaps=[1.0], token_ids=6)
    timings = RequestTimings(request_start=0.0, upstream_start=0.0, request_end=3.0, events=events)
    assert derive(timings).output_tokens == 6
    events.token_ids_complete = False
    assert derive(timings).output_tokens is None


def test_failed_request_has_no_tpot_and_an_unfinished_one_ends_now() -> None:
    events = _Events(first_content_at=1.0, n_events=2, usage={"completion_tokens": 5})
    timings = RequestTimings(request_start=0.0, upstream_start=0.5, events=events)
    timings.fail(ErrorKind.BROKEN, 200)
    timings.fail(ErrorKind.DISCONNECTED, 499)  # the first failure and the first status win
    m = derive(timings, now=4.0)
    assert m.e2e_s == 4.0 and m.upstream_s == 3.5 and m.ttft_s == 1.0
    assert m.tpot_s is None and m.error_kind == "broken" and m.status == 200


def test_non_streaming_request_reads_the_body_usage() -> None:
    timings = RequestTimings(
        request_start=0.0,
        upstream_start=0.0,
        request_end=2.0,
        status=200,
        usage={"prompt_tokens": 3, "completion_tokens": True},  # a bool is not a count
        speculative={"draft_acceptance_rate": "high", "mean_acceptance_length": 2},
    )
    m = derive(timings)
    assert m.ttft_s is None and m.tpot_s is None and m.n_events == 0
    assert m.prompt_tokens == 3 and m.output_tokens is None and m.tokens_per_event is None
    assert m.acceptance_rate is None and m.mean_acceptance_length == 2.0


def test_no_draft_proposed_is_null_acceptance_not_zero() -> None:
    # vLLM 0.32 reports rate 0.0 and length 1.0 for a request whose proposer found nothing; that
    # must not read as "every draft rejected" (rate 0 with drafts proposed)
    nothing = {"draft_acceptance_rate": 0.0, "mean_acceptance_length": 1.0, "num_draft_tokens": 0}
    rejected = {"draft_acceptance_rate": 0.0, "mean_acceptance_length": 1.0, "num_draft_tokens": 8}
    none, zero = (
        derive(
            RequestTimings(request_start=0.0, upstream_start=0.0, request_end=1.0, speculative=s)
        )
        for s in (nothing, rejected)
    )
    assert none.acceptance_rate is None and none.mean_acceptance_length is None
    assert zero.acceptance_rate == 0.0 and zero.mean_acceptance_length == 1.0


def test_record_carries_identity_and_measures() -> None:
    m = derive(RequestTimings(request_start=0.0, upstream_start=0.0, request_end=1.0, status=200))
    rec = m.record(
        request_id="r1",
        run_id="run",
        arm="baseline",
        t_start=5.0,
        model="m",
        endpoint="completions",
        stream=False,
        pair_id="p",
        shadow=True,
        engine_url="http://e:1",
        rerouted_from="speculative",
        reroute_reason=RerouteReason.DOWN,
        arm_in_flight=3,
        endpoint_in_flight=2,
        engine_running=4.0,
        engine_waiting=1.0,
        temperature=0.5,
        category="code",
    )
    measured = {f.name for f in dataclasses.fields(m)}
    assert {k: v for k, v in rec.to_dict().items() if k in measured} == dataclasses.asdict(m)
    assert (rec.request_id, rec.arm, rec.pair_id, rec.shadow) == ("r1", "baseline", "p", True)
    assert rec.engine_url == "http://e:1"
    assert (rec.rerouted_from, rec.reroute_reason) == ("speculative", RerouteReason.DOWN)
    assert (rec.arm_in_flight, rec.endpoint_in_flight) == (3, 2)
    assert (rec.engine_running, rec.engine_waiting) == (4.0, 1.0)
    assert (rec.temperature, rec.category) == (0.5, "code")
    # every record field is either measured or identity: nothing is left at a silent default
    identity = {"request_id", "run_id", "arm", "t_start", "model", "endpoint", "stream"}
    routing = {"pair_id", "shadow", "engine_url", "rerouted_from", "reroute_reason"}
    conditions = {
        "arm_in_flight",
        "endpoint_in_flight",
        "engine_running",
        "engine_waiting",
        "temperature",
        "category",
    }
    assert set(rec.to_dict()) == measured | identity | routing | conditions


# --------------------------------------------------------------------------- both paths


def _chat_stream() -> bytes:
    return fixture_path("chat_stream_usage_spec.sse").read_bytes()


def _reasoning_stream() -> bytes:
    """The real chat stream with its first five content deltas turned into reasoning deltas
    (vLLM's reasoning parser sends `reasoning_content` before the answer's `content`)."""
    data = _chat_stream()
    return re.sub(
        rb'"delta":\{"content":"([^"]+)"\}', rb'"delta":{"reasoning_content":"\1"}', data, count=5
    )


def _tool_stream() -> bytes:
    """The real chat stream with every content delta turned into a tool-call delta: the first
    one names the function, the others stream its arguments (vLLM's tool parser framing)."""
    data = _chat_stream()
    first = (
        rb'"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,'
        rb'"function":{"name":"lookup","arguments":"\1"}}]}'
    )
    data = re.sub(rb'"delta":\{"content":"([^"]+)"\}', first, data, count=1)
    rest = rb'"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\1"}}]}'
    return re.sub(rb'"delta":\{"content":"([^"]+)"\}', rest, data)


STREAMS = {
    "content": ("chat.completions", _chat_stream, 10),
    "reasoning": ("chat.completions", _reasoning_stream, 10),
    "tool_calls": ("chat.completions", _tool_stream, 10),
    "baseline": (
        "chat.completions",
        lambda: fixture_path("chat_stream_usage_baseline.sse").read_bytes(),
        None,
    ),
    "token_ids": (
        "completions",
        lambda: fixture_path("completion_stream_usage_tokenids_spec.sse").read_bytes(),
        None,
    ),
}
CLOCK_FIELDS = {"request_id", "t_start", "e2e_s", "upstream_s", "ttft_s", "tpot_s"}
CLOCK_FIELDS |= {"mean_gap_s", "max_gap_s"}
# Who served it: the proxy knows the arm's endpoint, a client in front of the proxy does not.
# the endpoint, and the conditions the proxy notes when it sends (the load generator has none)
NOT_MEASURED = {
    "engine_url",
    "arm_in_flight",
    "endpoint_in_flight",
    "engine_running",
    "engine_waiting",
    "temperature",
    "category",
}


def _replay(data: bytes) -> web.Application:
    """An arm that answers every request with `data`, one write per event."""

    async def handler(request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream; charset=utf-8"})
        await resp.prepare(request)
        for event in data.split(b"\n\n"):
            if event:
                await resp.write(event + b"\n\n")
                await asyncio.sleep(0)
        await resp.write_eof()
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    app.router.add_post("/v1/completions", handler)
    return app


@pytest.mark.parametrize("name", list(STREAMS))
async def test_proxy_and_load_generator_derive_the_same_record(
    aiohttp_server: AiohttpServer, name: str
) -> None:
    endpoint, stream, expected_events = STREAMS[name]
    data = stream()
    if name == "reasoning":
        assert data.count(b'"reasoning_content"') == 5 and data.count(b'"content":"') == 6
    if name == "tool_calls":
        assert data.count(b'"tool_calls"') == 10 and data.count(b'"content":"') == 1  # preamble
    arm_url = str((await aiohttp_server(_replay(data))).make_url("")).rstrip("/")
    recorder = MemoryRecorder()
    cfg = Config(baseline_url=arm_url, speculative_url=arm_url, run_id="run")
    app = create_app(
        cfg,
        registry=CollectorRegistry(),
        recorder=recorder,
        with_store=False,
        with_stats=False,
    )
    proxy = await aiohttp_server(app)
    options = RequestOptions(model="tiny-llama", endpoint=endpoint)  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, [Target(str(proxy.make_url("")))], [Prompt((), 32)], options)
        result = await gen.send(0, gen.targets[0], gen.prompts[0])
    client = result.to_record(run_id="run", options=options)
    (served,) = [r for r in recorder.records if not r.shadow]

    # The same scanner on the same bytes: the reference every path must reproduce.
    reference = SSEScanner()
    reference.feed(data, 0.0)
    assert client.n_events == served.n_events == reference.n_events > 0
    if expected_events is not None:
        assert served.n_events == expected_events  # reasoning and tool-call events count
    assert _without_clock(client) == _without_clock(served)
    for name_ in CLOCK_FIELDS - {"request_id", "t_start"}:
        assert (getattr(client, name_) is None) == (getattr(served, name_) is None), name_
    # The client started before the proxy received the request and saw the first event after
    # the proxy forwarded it, so its TTFT contains the proxy's.
    assert client.ttft_s is not None and served.ttft_s is not None
    assert client.ttft_s > served.ttft_s


def _without_clock(rec: RequestRecord) -> dict[str, Any]:
    return {k: v for k, v in rec.to_dict().items() if k not in CLOCK_FIELDS | NOT_MEASURED}


def test_the_positional_record_puts_every_value_in_its_own_field() -> None:
    """`Measures.record` and `derive` build positionally (for speed): each field, given a value
    of its own, lands where the keyword form puts it."""
    measured = {f.name for f in dataclasses.fields(Measures)}
    values: dict[str, Any] = {}
    for i, f in enumerate(dataclasses.fields(RequestRecord)):
        values[f.name] = {
            "error_kind": ErrorKind.TIMEOUT,
            "reroute_reason": RerouteReason.DOWN,
            "stream": True,
            "shadow": True,
            "disconnected": True,
        }.get(f.name, f"v{i}" if f.type in ("str", "Arm", "str | None", "Arm | None") else i)
    m = Measures(**{k: v for k, v in values.items() if k in measured})
    rec = m.record(**{k: v for k, v in values.items() if k not in measured})
    assert rec == RequestRecord(**values)
    timings = RequestTimings(
        request_start=1.0,
        upstream_start=2.0,
        upstream_end=4.0,
        request_end=8.0,
        status=201,
        error_kind=ErrorKind.TIMEOUT,
        disconnected=True,
        usage={"prompt_tokens": 3, "completion_tokens": 5},
        speculative={"draft_acceptance_rate": 0.25, "mean_acceptance_length": 2.5},
    )
    got = derive(timings)
    assert dataclasses.asdict(got) == {
        **dict.fromkeys(measured),
        "status": 201,
        "e2e_s": 7.0,
        "upstream_s": 2.0,
        "prompt_tokens": 3,
        "output_tokens": 5,
        "n_events": 0,
        "acceptance_rate": 0.25,
        "mean_acceptance_length": 2.5,
        "error_kind": ErrorKind.TIMEOUT,
        "disconnected": True,
    }
