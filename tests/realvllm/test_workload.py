"""The tier's workload and the direct measurement, against fake servers (no vLLM)."""

from __future__ import annotations

import aiohttp
from pytest_aiohttp import AiohttpServer

from specproxy.realvllm.workload import completion_body, measure_direct, prompts
from tests.fake_openai import FakeOpenAI


def test_prompts_are_deterministic_and_bounded() -> None:
    first = prompts(30, seed=3)
    assert first == prompts(30, seed=3) and first != prompts(30, seed=4)
    assert all(5 <= len(p.split()) <= 60 for p in first)


def test_completion_body_is_greedy_and_runs_to_max_tokens() -> None:
    body = completion_body("hi", max_tokens=8, stream=True)
    assert body["temperature"] == 0.0 and body["ignore_eos"] is True
    assert body["max_tokens"] == 8 and body["stream"] is True and body["model"] == "tiny-llama"


async def test_measure_direct_interleaves_and_drops_warmup(aiohttp_server: AiohttpServer) -> None:
    fakes = {arm: FakeOpenAI(model="tiny-llama") for arm in ("speculative", "baseline")}
    urls = {}
    for arm, fake in fakes.items():
        urls[arm] = str((await aiohttp_server(fake.app())).make_url("")).rstrip("/")
    async with aiohttp.ClientSession() as session:
        result = await measure_direct(session, urls, prompts(6), max_tokens=4, warmup=2)
    assert all(len(result.latencies[arm]) == 4 for arm in ("speculative", "baseline"))
    assert all(len(fake.bodies) == 6 for fake in fakes.values())
    assert [b["prompt"] for b in fakes["baseline"].bodies] == prompts(6)
    assert len(result.acceptance_rates) == 4  # speculative arm only
    assert result.speedup > 0


def test_random_token_prompts_repeat_no_token_and_skip_special_ids() -> None:
    from specproxy.realvllm.model_dir import SPECIAL_TOKENS, VOCAB_SIZE
    from specproxy.realvllm.workload import random_token_prompts

    batch = random_token_prompts(20, 48, seed=5)
    assert batch == random_token_prompts(20, 48, seed=5) != random_token_prompts(20, 48, seed=6)
    for ids in batch:
        assert len(ids) == len(set(ids)) == 48  # distinct: no n-gram of the prompt repeats
        assert all(len(SPECIAL_TOKENS) <= i < VOCAB_SIZE for i in ids)
    body = completion_body(batch[0], max_tokens=4, temperature=1.0)
    assert body["prompt"] == batch[0] and body["temperature"] == 1.0
    for bad in (0, VOCAB_SIZE):
        try:
            random_token_prompts(1, bad)
        except ValueError:
            continue
        raise AssertionError(f"length {bad} accepted")
