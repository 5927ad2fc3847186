"""The emulated server against the real vLLM 0.32 captures, its errors, controls and timing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import statistics
import time
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pytest_aiohttp import AiohttpClient

from specproxy.emulator import (
    EMULATOR_KEY,
    EmulatorConfig,
    create_emulator_app,
    leviathan_speedup,
    run_emulator,
)
from specproxy.emulator.model import Sequence
from specproxy.emulator.protocol import GenerationRequest
from tests.conftest import fixture_path
from tests.emulator.conftest import assert_same_shape, fixture_events, load_json, sse_payloads

SPEC = EmulatorConfig(
    speculative=True,
    per_request_metrics=True,
    per_request_spec_metrics="summary",
    time_scale=0.1,
    warmup_requests=0,
)
BASE = dataclasses.replace(SPEC, speculative=False, per_request_spec_metrics="none")
CHAT = {"messages": [{"role": "user", "content": "Say ord: a few times, please."}]}
PROMPT = {"prompt": "Repeat after me: ld ld ld"}


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(text: str, name: str, **labels: str) -> float:
    for key, value in metric_values(text).items():
        if key[0] == name and all((k, v) in key[1] for k, v in labels.items()):
            return value
    raise KeyError(name)


# ---- fixture shapes ---------------------------------------------------------------------------

NONSTREAM_CASES = [
    ("chat_nonstream_baseline.json", BASE, "/v1/chat/completions", {**CHAT, "max_tokens": 32}),
    ("chat_nonstream_spec.json", SPEC, "/v1/chat/completions", {**CHAT, "max_tokens": 32}),
    ("completion_nonstream_baseline.json", BASE, "/v1/completions", {**PROMPT, "max_tokens": 48}),
    ("completion_nonstream_spec.json", SPEC, "/v1/completions", {**PROMPT, "max_tokens": 48}),
]


@pytest.mark.parametrize(("fixture", "cfg", "path", "body"), NONSTREAM_CASES)
async def test_nonstream_body_has_the_fixture_shape(
    fixture: str, cfg: EmulatorConfig, path: str, body: dict[str, Any]
) -> None:
    async with (
        run_emulator(cfg) as url,
        aiohttp.ClientSession() as session,
        session.post(url + path, json={"model": "tiny-llama", **body}) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "application/json"
        ours = await resp.json()
    theirs = load_json(fixture)
    assert_same_shape(ours, theirs)
    assert ours["usage"]["completion_tokens"] == body["max_tokens"]
    assert ours["choices"][0]["finish_reason"] == "length"
    assert ours["id"].startswith("chatcmpl-" if "chat" in path else "cmpl-")
    spec = ours["metrics"]["speculative_decoding"]
    if cfg.speculative:
        assert spec["num_draft_tokens"] == 4 * spec["num_spec_steps"]
        assert sum(spec["acceptance_histogram"]) == spec["num_spec_steps"]
        assert spec["num_accepted_draft_tokens"] == sum(
            j * count for j, count in enumerate(spec["acceptance_histogram"])
        )
    else:
        assert spec is None


STREAM_CASES = [
    (
        "chat_stream_usage_baseline.sse",
        BASE,
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 32, "stream_options": {"include_usage": True}},
    ),
    (
        "chat_stream_usage_spec.sse",
        SPEC,
        "/v1/chat/completions",
        {**CHAT, "max_tokens": 32, "stream_options": {"include_usage": True}},
    ),
    ("chat_stream_nousage_spec.sse", SPEC, "/v1/chat/completions", {**CHAT, "max_tokens": 32}),
    (
        "completion_stream_n2_spec.sse",
        SPEC,
        "/v1/completions",
        {
            **PROMPT,
            "max_tokens": 24,
            "n": 2,
            "temperature": 0.8,
            "stream_options": {"include_usage": True},
        },
    ),
    (
        "completion_stream_usage_tokenids_spec.sse",
        SPEC,
        "/v1/completions",
        {
            **PROMPT,
            "max_tokens": 24,
            "return_token_ids": True,
            "stream_options": {"include_usage": True},
        },
    ),
]


def event_kind(event: dict[str, Any]) -> str:
    if not event["choices"]:
        return "usage"
    choice = event["choices"][0]
    if "role" in choice.get("delta", {}):
        return "role"
    if choice["finish_reason"] is not None:
        return "final"
    return "first" if choice.get("prompt_token_ids") is not None else "content"


@pytest.mark.parametrize(("fixture", "cfg", "path", "body"), STREAM_CASES)
async def test_stream_has_the_fixture_framing_and_shape(
    fixture: str, cfg: EmulatorConfig, path: str, body: dict[str, Any]
) -> None:
    async with run_emulator(cfg) as url, aiohttp.ClientSession() as session:
        payload = {"model": "tiny-llama", "stream": True, **body}
        async with session.post(url + path, json=payload) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream; charset=utf-8"
            assert resp.headers["Transfer-Encoding"] == "chunked"
            text = await resp.text()
    payloads = sse_payloads(text)
    assert payloads[-1] == "[DONE]"
    ours = [json.loads(p) for p in payloads[:-1]]
    theirs = fixture_events(fixture)
    kinds_ours = [event_kind(e) for e in ours]
    kinds_theirs = [event_kind(e) for e in theirs]
    assert set(kinds_ours) == set(kinds_theirs)
    assert kinds_ours.count("final") == kinds_theirs.count("final")  # one per choice
    assert kinds_ours[-1] == kinds_theirs[-1]  # usage chunk last, when asked for
    reference: dict[str, dict[str, Any]] = {}
    for kind, event in zip(kinds_theirs, theirs, strict=True):
        reference.setdefault(kind, event)
    for kind, event in zip(kinds_ours, ours, strict=True):
        assert_same_shape(event, reference[kind], f"{kind} event")
    total = body["max_tokens"] * body.get("n", 1)
    if kinds_ours[-1] == "usage":
        assert ours[-1]["usage"]["completion_tokens"] == total
        assert ("metrics" in ours[-1]) == ("metrics" in theirs[-1])


async def test_stream_carries_all_tokens_of_a_step_in_one_event() -> None:
    cfg = dataclasses.replace(SPEC, time_scale=0.5, acceptance=0.8)
    body = {**PROMPT, "max_tokens": 64, "stream": True, "return_token_ids": True}
    body["stream_options"] = {"include_usage": True}
    async with (
        run_emulator(cfg) as url,
        aiohttp.ClientSession() as session,
        session.post(url + "/v1/completions", json=body) as resp,
    ):
        events = [json.loads(p) for p in sse_payloads(await resp.text())[:-1]]
    per_event = [len(e["choices"][0]["token_ids"]) for e in events if e["choices"]]
    steps = events[-1]["metrics"]["speculative_decoding"]["num_spec_steps"]
    assert sum(per_event) == 64
    assert per_event[0] == 1  # the prefill step yields the first token alone
    assert len(per_event) <= 1 + steps  # one event per step (fewer only if a slow client merges)
    assert statistics.fmean(per_event) > 1.5


async def test_models_health_and_headers_match_vllm() -> None:
    async with run_emulator(BASE) as url, aiohttp.ClientSession() as session:
        async with session.get(url + "/v1/models") as resp:
            assert_same_shape(await resp.json(), load_json("models.json"))
        async with session.get(url + "/health") as resp:
            assert resp.status == 200
            assert await resp.read() == b""
        body = {**PROMPT, "max_tokens": 4}
        async with session.post(url + "/v1/completions", json=body) as resp:
            ours = {k.lower() for k in resp.headers}
    for name in ("response_headers_nonstream.txt",):
        lines = fixture_path(name).read_text().splitlines()[1:]
        theirs = {line.split(":", 1)[0].lower() for line in lines if line}
        assert theirs <= ours


# ---- errors -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fixture", "raw"),
    [
        ("error_unknown_model.json", b'{"model": "nope", "prompt": "hi"}'),
        ("error_too_long.json", b'{"model": "tiny-llama", "prompt": "hi", "max_tokens": 5000}'),
        ("error_bad_json.json", b"{bad"),
    ],
)
async def test_error_bodies_match_the_fixtures(fixture: str, raw: bytes) -> None:
    theirs = load_json(fixture)
    async with run_emulator(BASE) as url, aiohttp.ClientSession() as session:
        headers = {"Content-Type": "application/json"}
        async with session.post(url + "/v1/completions", data=raw, headers=headers) as resp:
            assert resp.status == theirs["error"]["code"]
            ours = await resp.json()
    assert ours == theirs  # same message text, type, param and code


BAD_BODIES: list[tuple[str, Any, int]] = [
    ("/v1/completions", b"", 400),
    ("/v1/completions", b"[1, 2]", 400),
    ("/v1/completions", b'"text"', 400),
    ("/v1/completions", {}, 400),
    ("/v1/completions", {"prompt": ""}, 400),
    ("/v1/completions", {"prompt": []}, 400),
    ("/v1/completions", {"prompt": {"a": 1}}, 400),
    ("/v1/completions", {"prompt": [[1, 2], "x", 3.5]}, 400),
    ("/v1/completions", {"prompt": "hi", "n": 0}, 400),
    ("/v1/completions", {"prompt": "hi", "n": "2"}, 400),
    ("/v1/completions", {"prompt": "hi", "n": 10**30}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 0}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 2.5}, 400),
    ("/v1/completions", {"prompt": "hi", "max_tokens": True}, 400),
    ("/v1/completions", {"prompt": "hi", "temperature": -1}, 400),
    ("/v1/completions", {"prompt": "hi", "temperature": "hot"}, 400),
    ("/v1/completions", {"prompt": "hi", "stream": "yes"}, 400),
    ("/v1/completions", {"prompt": "hi", "stream_options": {"include_usage": True}}, 400),
    ("/v1/completions", {"prompt": "hi", "stream": True, "stream_options": 3}, 400),
    ("/v1/completions", {"prompt": "hi", "seed": "x"}, 400),
    ("/v1/completions", {"prompt": "word " * 1100, "max_tokens": 8}, 400),
    ("/v1/completions", {"prompt": "hi", "model": 5}, 400),
    ("/v1/completions", {"prompt": "hi", "model": "gpt-4"}, 404),
    ("/v1/chat/completions", {}, 400),
    ("/v1/chat/completions", {"messages": []}, 400),
    ("/v1/chat/completions", {"messages": "hi"}, 400),
    ("/v1/chat/completions", {"messages": [{"content": "no role"}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": 7}]}, 400),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"x": 1}]}]}, 400),
]


async def test_bad_requests_get_vllm_errors_never_500() -> None:
    async with run_emulator(BASE) as url, aiohttp.ClientSession() as session:
        for path, body, status in BAD_BODIES:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            async with session.post(url + path, data=raw) as resp:
                assert resp.status == status, (path, body, await resp.text())
                error = (await resp.json())["error"]
                assert error["code"] == status
                assert isinstance(error["message"], str) and error["message"]
                assert error["type"] in ("BadRequestError", "Bad Request", "NotFoundError")
        async with session.get(url + "/v1/completions") as resp:
            assert resp.status == 405
            assert await resp.json() == {"detail": "Method Not Allowed"}
        async with session.get(url + "/v2/nothing") as resp:
            assert resp.status == 404
            assert await resp.json() == {"detail": "Not Found"}
        async with session.get(url + "/metrics") as resp:  # nothing reached the engine
            assert (
                sample(await resp.text(), "vllm:request_success_total", finished_reason="length")
                == 0
            )


async def test_v0_metrics_switch_serves_v0_names() -> None:
    cfg = dataclasses.replace(SPEC, metrics_version="v0")
    async with run_emulator(cfg) as url, aiohttp.ClientSession() as session:
        for n in (1, 2):
            body = {**PROMPT, "max_tokens": 12, "n": n}
            async with session.post(url + "/v1/completions", json=body) as resp:
                assert resp.status == 200
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    assert sample(text, "vllm:request_success_total", finished_reason="length") == 3
    assert sample(text, "vllm:generation_tokens_total") == 36
    assert 0 < sample(text, "vllm:spec_decode_draft_acceptance_rate") <= 1
    assert "vllm:spec_decode_num_drafts_total" not in text
    assert 'engine="0"' not in text


# ---- behaviour --------------------------------------------------------------------------------


async def _texts(url: str, bodies: list[dict[str, Any]]) -> list[Any]:
    out = []
    async with aiohttp.ClientSession() as session:
        for body in bodies:
            async with session.post(url + "/v1/completions", json=body) as resp:
                data = await resp.json()
            spec = data["metrics"]["speculative_decoding"]
            out.append((data["choices"][0]["token_ids"], spec["acceptance_histogram"]))
    return out


async def test_same_seed_same_tokens_and_acceptance_draws() -> None:
    bodies = [
        {**PROMPT, "max_tokens": 24, "return_token_ids": True, "temperature": 1.0} for _ in range(3)
    ]
    cfg = dataclasses.replace(SPEC, seed=7)
    async with run_emulator(cfg) as url:
        first = await _texts(url, bodies)
    async with run_emulator(cfg) as url:
        again = await _texts(url, bodies)
    async with run_emulator(dataclasses.replace(cfg, seed=8)) as url:
        other = await _texts(url, bodies)
    assert first == again
    assert first != other
    assert len({json.dumps(t) for t in first}) == 3  # sampling differs between requests


async def test_greedy_and_seeded_requests_repeat_on_one_server() -> None:
    greedy = {**PROMPT, "max_tokens": 16, "return_token_ids": True, "temperature": 0}
    seeded = {**PROMPT, "max_tokens": 16, "return_token_ids": True, "seed": 3}
    async with run_emulator(SPEC) as url:
        a, b, c, d = await _texts(url, [greedy, seeded, greedy, seeded])
    assert a == c
    assert b == d
    assert a != b


async def test_max_tokens_absent_stops_at_an_emulated_eos() -> None:
    cfg = dataclasses.replace(BASE, default_output_tokens=8)
    async with run_emulator(cfg) as url, aiohttp.ClientSession() as session:
        reasons = []
        for _ in range(6):
            async with session.post(url + "/v1/completions", json=PROMPT) as resp:
                data = await resp.json()
            reasons.append(data["choices"][0]["finish_reason"])
            assert 1 <= data["usage"]["completion_tokens"] < 1024
    assert "stop" in reasons


async def test_metrics_count_what_was_served() -> None:
    async with run_emulator(SPEC) as url, aiohttp.ClientSession() as session:
        served = prompt = 0
        for n in (1, 2, 1):
            body = {**PROMPT, "max_tokens": 20, "n": n}
            async with session.post(url + "/v1/completions", json=body) as resp:
                usage = (await resp.json())["usage"]
            served += usage["completion_tokens"]
            prompt += usage["prompt_tokens"] * n
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    assert sample(text, "vllm:generation_tokens_total") == served
    assert sample(text, "vllm:prompt_tokens_total") == prompt
    assert sample(text, "vllm:request_success_total", finished_reason="length") == 4
    assert sample(text, "vllm:request_params_n_count") == 3
    assert sample(text, "vllm:num_requests_running") == 0
    per_pos = [
        sample(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position=str(i))
        for i in range(4)
    ]
    assert per_pos == sorted(per_pos, reverse=True)
    assert sum(per_pos) == sample(text, "vllm:spec_decode_num_accepted_tokens_total")
    drafts = sample(text, "vllm:spec_decode_num_drafts_total")
    assert sample(text, "vllm:spec_decode_num_draft_tokens_total") == 4 * drafts
    # every decode step of every sequence is one draft: tokens = prefill token + drafts + accepted
    assert served <= 4 + drafts + sum(per_pos)


async def test_client_going_away_aborts_its_sequences(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_emulator_app(dataclasses.replace(SPEC, time_scale=1.0)))
    body = {**PROMPT, "max_tokens": 500, "stream": True}
    resp = await client.post("/v1/completions", json=body)
    await resp.content.readuntil(b"\n\n")
    resp.close()
    emu = client.app[EMULATOR_KEY]
    for _ in range(200):
        if not emu.engine.has_work:
            break
        await asyncio.sleep(0.01)
    assert not emu.engine.has_work
    text = emu.metrics.render().decode()
    assert sample(text, "vllm:request_success_total", finished_reason="abort") == 1


async def test_admin_config_patches_live_knobs(aiohttp_client: AiohttpClient) -> None:
    client = await aiohttp_client(create_emulator_app(SPEC))
    resp = await client.post("/emulator/config", json={"slowdown": 3.0, "acceptance": 0.2})
    assert resp.status == 200
    knobs = (await resp.json())["knobs"]
    assert knobs["slowdown"] == 3.0 and knobs["acceptance"] == 0.2
    emu = client.app[EMULATOR_KEY]
    assert emu.engine.physics.slowdown == 3.0
    assert (await (await client.get("/emulator/config")).json())["knobs"] == knobs
    for bad in ({"nope": 1}, {"acceptance": 2.0}, {"slowdown": "x"}, [1]):
        resp = await client.post("/emulator/config", json=bad)
        assert resp.status == 400, bad
        assert (await resp.json())["error"]["code"] == 400
    resp = await client.post("/emulator/config", data=b"{")
    assert resp.status == 400
    assert emu.engine.physics.acceptance == 0.2  # failed patches change nothing


async def test_restart_resets_counters_and_start_time(aiohttp_client: AiohttpClient) -> None:
    cfg = dataclasses.replace(SPEC, warmup_requests=4)
    client = await aiohttp_client(create_emulator_app(cfg))
    emu = client.app[EMULATOR_KEY]
    for _ in range(4):
        await (await client.post("/v1/completions", json={**PROMPT, "max_tokens": 8})).read()
    assert emu.engine.warm_fraction == 0.0
    before = (await (await client.get("/metrics")).read()).decode()
    assert sample(before, "vllm:request_success_total", finished_reason="length") == 4
    slow = dataclasses.replace(cfg, time_scale=1.0)
    emu.patch({"time_scale": slow.time_scale})
    stream = await client.post(
        "/v1/completions", json={**PROMPT, "max_tokens": 900, "stream": True}
    )
    await stream.content.readuntil(b"\n\n")
    await asyncio.sleep(0.002)  # start times must differ
    resp = await client.post("/emulator/restart")
    assert resp.status == 200
    with pytest.raises(aiohttp.ClientError):  # the in-flight stream is cut, like a crashed engine
        await stream.read()
    after = (await (await client.get("/metrics")).read()).decode()
    assert sample(after, "vllm:request_success_total", finished_reason="length") == 0
    assert sample(after, "vllm:generation_tokens_total") == 0
    assert sample(after, "process_start_time_seconds") > sample(
        before, "process_start_time_seconds"
    )
    assert emu.engine.warm_fraction == 1.0


# ---- timing physics, read from the engine's own clock ------------------------------------------
#
# The engine stamps tokens with its step schedule (see the server module), so the timings it
# reports are the modelled ones whatever the machine's load; the client's wall clock only gives
# lower bounds (no token arrives before its step ends). Batches are made deterministic where the
# physics depends on them: one request at a time, or one request with n sequences.


async def _reported(
    url: str, *, requests: int, max_tokens: int
) -> list[tuple[float, float, int, float]]:
    """(ttft_s, e2e_s, tokens, wall_e2e_s) per request, one at a time: TTFT and E2E as the
    emulator's per-request metrics report them, the wall E2E as the client saw it."""
    rows: list[tuple[float, float, int, float]] = []
    body = {**PROMPT, "max_tokens": max_tokens}
    async with aiohttp.ClientSession() as session:
        for _ in range(requests):
            start = time.perf_counter()
            async with session.post(url + "/v1/completions", json=body) as resp:
                data = await resp.json()
            wall = time.perf_counter() - start
            metrics = data["metrics"]
            ttft = metrics["time_to_first_token_ms"] / 1000.0
            e2e = ttft + metrics["generation_time_ms"] / 1000.0
            rows.append((ttft, e2e, data["usage"]["completion_tokens"], wall))
    return rows


async def test_concurrency_one_reproduces_the_leviathan_speedup() -> None:
    """Reported TPOT speedup within 5% of (1-a^(k+1))/((1-a)(kc+1)); E2E lower (prefill)."""
    spec = dataclasses.replace(SPEC, acceptance_spread=0.0)
    base = dataclasses.replace(spec, speculative=False, per_request_spec_metrics="none")
    runs = dict(requests=32, max_tokens=128)
    async with run_emulator(spec) as spec_url, run_emulator(base) as base_url:
        s, b = await asyncio.gather(
            _reported(spec_url, **runs),
            _reported(base_url, **runs),
        )
    for rows in (s, b):
        assert all(n == 128 for _, _, n, _ in rows)
        assert all(wall >= e2e - 0.001 for _, e2e, _, wall in rows)  # 1 ms: timer granularity

    # Medians over requests: acceptance draws vary per request; the clock does not.
    def tpot(rows: list[tuple[float, float, int, float]]) -> float:
        return statistics.median((e2e - ttft) / (n - 1) for ttft, e2e, n, _ in rows)

    def e2e(rows: list[tuple[float, float, int, float]]) -> float:
        return statistics.median(row[1] for row in rows)

    formula = leviathan_speedup(spec.acceptance, spec.num_speculative_tokens, spec.draft_cost_ratio)
    tpot_speedup = tpot(b) / tpot(s)
    e2e_speedup = e2e(b) / e2e(s)
    print(f"formula {formula:.3f} TPOT {tpot_speedup:.3f} E2E {e2e_speedup:.3f}")
    assert abs(tpot_speedup / formula - 1.0) < 0.05
    assert e2e_speedup < tpot_speedup


async def _batch_of(
    aiohttp_client: AiohttpClient, cfg: EmulatorConfig, n: int, max_tokens: int
) -> tuple[list[Sequence], float]:
    """One request with `n` sequences (all admitted in one step, so every step runs the whole
    batch); returns the engine's sequences, stamped on its clock, and the client's wall E2E."""
    client = await aiohttp_client(create_emulator_app(cfg))
    emu = client.app[EMULATOR_KEY]
    submitted: list[Sequence] = []
    submit = emu.submit

    def record(req: GenerationRequest) -> tuple[str, list[Sequence], asyncio.Queue[Any]]:
        request_id, seqs, sink = submit(req)
        submitted.extend(seqs)
        return request_id, seqs, sink

    emu.submit = record  # type: ignore[method-assign]
    start = time.perf_counter()
    resp = await client.post("/v1/completions", json={**PROMPT, "max_tokens": max_tokens, "n": n})
    data = await resp.json()
    wall = time.perf_counter() - start
    assert resp.status == 200 and data["usage"]["completion_tokens"] == n * max_tokens
    assert len(submitted) == n
    return submitted, wall


async def test_speculation_loses_at_high_load(aiohttp_client: AiohttpClient) -> None:
    """64 sequences per step pass the roofline knee: speculation pays for every rejected draft."""
    spec = dataclasses.replace(SPEC, time_scale=0.5)
    base = dataclasses.replace(spec, speculative=False)
    results = {}
    for name, cfg in (("spec", spec), ("base", base)):
        seqs, wall = await _batch_of(aiohttp_client, cfg, n=64, max_tokens=32)
        for seq in seqs:
            assert seq.first_token_at is not None and seq.finished_at is not None
            assert seq.generated == 32
        e2e = [s.finished_at - s.arrival for s in seqs if s.finished_at is not None]
        tpot = [
            (s.finished_at - s.first_token_at) / (s.generated - 1)
            for s in seqs
            if s.finished_at is not None and s.first_token_at is not None
        ]
        assert wall >= max(e2e) - 0.001  # no token is sent before its step ends
        results[name] = statistics.median(e2e), statistics.median(tpot)
    e2e_speedup = results["base"][0] / results["spec"][0]
    tpot_speedup = results["base"][1] / results["spec"][1]
    print(f"batch 64: TPOT speedup {tpot_speedup:.3f} E2E speedup {e2e_speedup:.3f}")
    assert tpot_speedup < 1.0
    assert e2e_speedup < 1.0
