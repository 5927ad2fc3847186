"""The load generator against a fake OpenAI server: timing fields, arrivals, records."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import aiohttp
import numpy as np
import pytest
from pytest_aiohttp import AiohttpServer

from specproxy.loadgen import LoadGenerator, RequestOptions, Target, poisson_gaps
from specproxy.prompts import Prompt
from specproxy.proxy.conditions import OTHER, Categories
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
    # the conditions it met (issue 26): its temperature, and, sent straight to the arm, the
    # calls in flight to it (itself); no categories given: no category kept
    assert record.temperature == 0.5
    assert record.endpoint_in_flight == record.arm_in_flight == 1
    assert record.category is None
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


def test_arrival_gaps_are_vllms_gamma() -> None:
    """vLLM's `--burstiness`: gamma gaps of shape b and scale 1/(rate*b), so the mean gap is
    1/rate for every b and the squared coefficient of variation is 1/b; b=1 is Poisson."""
    from itertools import islice

    from specproxy.loadgen import arrival_gaps

    for b in (0.25, 1.0, 4.0):
        gaps = np.array(list(islice(arrival_gaps(5.0, np.random.default_rng(0), b), 20000)))
        assert gaps.mean() == pytest.approx(0.2, rel=0.05)
        assert gaps.var() / gaps.mean() ** 2 == pytest.approx(1 / b, rel=0.1)
    poisson = list(islice(poisson_gaps(5.0, np.random.default_rng(1)), 50))
    assert list(islice(arrival_gaps(5.0, np.random.default_rng(1), 1.0), 50)) == poisson
    with pytest.raises(ValueError, match="burstiness"):
        next(arrival_gaps(1.0, np.random.default_rng(0), 0.0))


async def test_each_target_has_its_own_closed_loop_pool(aiohttp_server: AiohttpServer) -> None:
    """`concurrency` clients per target: a slow target never holds back a fast one's clients,
    each target gets its share of the count, and the j-th request of each carries one prompt."""
    fakes = {"slow": FakeOpenAI(event_delay_s=0.02), "fast": FakeOpenAI(event_delay_s=0.005)}
    peaks: dict[str, int] = {}
    targets = []
    for name, fake in fakes.items():
        app = fake.app()
        active = [0]

        def counting(name: str, active: list[int]) -> aiohttp.typedefs.Middleware:
            @aiohttp.web.middleware
            async def count(
                request: aiohttp.web.Request, handler: aiohttp.typedefs.Handler
            ) -> aiohttp.web.StreamResponse:
                active[0] += 1
                peaks[name] = max(peaks.get(name, 0), active[0])
                try:
                    return await handler(request)
                finally:
                    active[0] -= 1

            return count

        app.middlewares.append(counting(name, active))
        targets.append(Target(str((await aiohttp_server(app)).make_url("")), name))
    prompts = [Prompt(((("user", f"prompt {i}"),)), 4) for i in range(7)]
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, targets, prompts, RequestOptions(model="m"), seed=5)
        results = await gen.run_closed_loop(3, count=30)
    assert sorted(r.index for r in results) == list(range(30))
    assert len(fakes["slow"].bodies) == len(fakes["fast"].bodies) == 15
    assert peaks == {"slow": 3, "fast": 3}
    by_index = {r.index: r for r in results}
    assert {by_index[i].arm for i in range(0, 30, 2)} == {"slow"}
    assert {by_index[i].arm for i in range(1, 30, 2)} == {"fast"}
    # paired by position: both targets drew the same prompt sequence
    sent = {n: sorted(json.dumps(b["messages"]) for b in f.bodies) for n, f in fakes.items()}
    assert sent["slow"] == sent["fast"]


async def test_a_prompts_category_travels_in_its_header(aiohttp_server: AiohttpServer) -> None:
    from specproxy.loadgen import CATEGORY_HEADER

    fake = FakeOpenAI()
    base = await _base(aiohttp_server, fake)
    prompts = [Prompt((("user", "x"),), 4, category="math"), Prompt((("user", "y"),), 4)]
    options = RequestOptions(model="m", category_header=CATEGORY_HEADER)
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, [Target(base, "a")], prompts, options)
        labelled = await gen.send(0, gen.targets[0], prompts[0])
        await gen.send(1, gen.targets[0], prompts[1])
    assert CATEGORY_HEADER == "x-specproxy-category"
    assert fake.headers[0][CATEGORY_HEADER] == "math" and labelled.category == "math"
    assert CATEGORY_HEADER not in fake.headers[1]


async def test_records_carry_a_bounded_category_and_the_calls_in_flight(
    aiohttp_server: AiohttpServer,
) -> None:
    """Three requests sent at once to one arm met 1, 2 and 3 calls in flight; their dataset
    categories are bounded as the proxy bounds its header (here to the first one, the rest
    "other"); through a proxy (no arm named) the generator records no load of its own."""
    base = await _base(aiohttp_server, FakeOpenAI(event_delay_s=0.001))
    options = RequestOptions(model="m")
    labelled = [dataclasses.replace(PROMPTS[0], category=c) for c in ("code", "math", "Code")]
    async with aiohttp.ClientSession() as session:
        gen = LoadGenerator(session, [Target(base, "baseline")], PROMPTS, options)
        results = await asyncio.gather(
            *(gen.send(i, gen.targets[0], p) for i, p in enumerate(labelled))
        )
        proxied = await gen.send(9, Target(base), PROMPTS[0])
    categories = Categories(1)
    records = [r.to_record(run_id="r", options=options, categories=categories) for r in results]
    assert sorted(r.endpoint_in_flight or 0 for r in records) == [1, 2, 3]
    assert [r.category for r in records] == ["code", OTHER, "code"]  # case folded, bounded
    assert proxied.in_flight is None
