"""The load generator against a fake OpenAI server: timing fields, arrivals, records."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import numpy as np
import pytest
from pytest_aiohttp import AiohttpServer

from specproxy.loadgen import LoadGenerator, RequestOptions, Target, poisson_gaps
from specproxy.prompts import Prompt
from tests.fake_openai import FakeOpenAI

PROMPTS = [Prompt((("user", "hi"),), 8), Prompt((("user", "a longer prompt"),), 5)]


async def _base(aiohttp_server: AiohttpServer, fake: FakeOpenAI) -> str:
    server = await aiohttp_server(fake.app())
    return str(server.make_url("")).rstrip("/")


def test_poisson_gaps_have_the_rate() -> None:
    gen = poisson_gaps(20.0, np.random.default_rng(1))
    gaps = [next(gen) for _ in range(20000)]
    assert np.mean(gaps) == pytest.approx(1 / 20, rel=0.03)
    assert np.std(gaps) == pytest.approx(1 / 20, rel=0.05)  # exponential: sd == mean
    with pytest.raises(ValueError, match="rate"):
        next(poisson_gaps(0.0, np.random.default_rng(1)))


@pytest.mark.parametrize("endpoint", ["chat.completions", "completions"])
async def test_streamed_request_is_timed_and_parsed(
    aiohttp_server: AiohttpServer, endpoint: str
) -> None:
    fake = FakeOpenAI(tokens_per_event=3, event_delay_s=0.002)
    base = await _base(aiohttp_server, fake)
    options = RequestOptions(model="m", endpoint=endpoint, temperature=0.5)  # type: ignore[arg-type]
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, [Target(base, "speculative")], PROMPTS, options)
        result = await gen.send(0, gen.targets[0], PROMPTS[0])
    assert result.ok and result.status == 200
    assert result.output_tokens == 8 and result.prompt_tokens == 10
    assert result.n_events == 3  # 3 + 3 + 2 tokens
    assert result.ttft_ns is not None and 0 < result.ttft_ns < result.e2e_ns
    assert result.max_gap_ns is not None and result.max_gap_ns >= 1_500_000
    assert result.acceptance_rate == 0.75 and result.mean_acceptance_length == 2.5
    assert 0 < result.parse_ns < result.e2e_ns
    body = fake.bodies[0]
    assert body["temperature"] == 0.5 and body["stream_options"] == {"include_usage": True}
    assert ("messages" in body) == (endpoint == "chat.completions")

    record = result.to_record(run_id="r", options=options)
    assert record.arm == "speculative" and record.run_id == "r"
    assert record.e2e_s == pytest.approx(result.e2e_ns / 1e9)
    assert record.tpot_s == pytest.approx((record.e2e_s - record.ttft_s) / 7)  # type: ignore[operator]
    assert record.tokens_per_event == pytest.approx(8 / 3)


async def test_non_streaming_and_errors(aiohttp_server: AiohttpServer) -> None:
    fake = FakeOpenAI(fail_every=2)
    base = await _base(aiohttp_server, fake)
    options = RequestOptions(model="m", stream=False, max_tokens_cap=4)
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, [Target(base, "baseline")], PROMPTS, options)
        ok = await gen.send(0, gen.targets[0], PROMPTS[0])
        failed = await gen.send(1, gen.targets[0], PROMPTS[0])
        refused = await gen.send(2, Target("http://127.0.0.1:9", "baseline"), PROMPTS[0])
    assert ok.ok and ok.ttft_ns is None and ok.output_tokens == 4  # capped budget
    assert fake.bodies[0]["max_tokens"] == 4 and "stream_options" not in fake.bodies[0]
    assert failed.error_kind == "http_5xx" and failed.status == 500 and not failed.ok
    assert refused.error_kind == "connect" and not refused.ok


async def test_open_loop_count_and_split(aiohttp_server: AiohttpServer) -> None:
    spec, base = FakeOpenAI(), FakeOpenAI()
    targets = [
        Target(await _base(aiohttp_server, spec), "speculative"),
        Target(await _base(aiohttp_server, base), "baseline"),
    ]
    seen: list[int] = []
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, targets, PROMPTS, RequestOptions(model="m"), seed=3)
        results = await gen.run_open_loop(400.0, count=60, on_result=lambda r: seen.append(r.index))
    assert [r.index for r in results] == list(range(60))
    assert sorted(seen) == list(range(60))
    assert len(spec.bodies) + len(base.bodies) == 60
    assert len(spec.bodies) == len(base.bodies) == 30  # balanced rounds, not a random split
    # each round sends one prompt to both arms: the arms see the same prompts
    prompts = sorted(json.dumps(b["messages"]) for b in spec.bodies)
    assert prompts == sorted(json.dumps(b["messages"]) for b in base.bodies)
    assert all(r.ok for r in results)
    assert all(r.lateness_ns >= 0 for r in results)


async def test_open_loop_duration_and_stop(aiohttp_server: AiohttpServer) -> None:
    fake = FakeOpenAI()
    targets = [Target(await _base(aiohttp_server, fake), "baseline")]
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, targets, PROMPTS, RequestOptions(model="m"))
        timed = await gen.run_open_loop(50.0, duration_s=0.4)
        stop = asyncio.Event()
        stop.set()
        stopped = await gen.run_open_loop(50.0, stop=stop)
    assert 3 <= len(timed) <= 60  # ~20 expected; a loose bound, never a speed target
    assert stopped == []
    with pytest.raises(ValueError, match="never ends"):
        await gen.run_open_loop(1.0)


async def test_closed_loop_respects_concurrency(aiohttp_server: AiohttpServer) -> None:
    fake = FakeOpenAI(event_delay_s=0.005)
    active = 0
    peak = 0
    app = fake.app()

    @aiohttp.web.middleware
    async def count(
        request: aiohttp.web.Request, handler: aiohttp.typedefs.Handler
    ) -> aiohttp.web.StreamResponse:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        try:
            return await handler(request)
        finally:
            active -= 1

    app.middlewares.append(count)
    server = await aiohttp_server(app)
    targets = [Target(str(server.make_url("")), "baseline")]
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, targets, PROMPTS, RequestOptions(model="m"))
        results = await gen.run_closed_loop(3, count=12)
    assert len(results) == 12 and len(fake.bodies) == 12
    assert peak == 3
