"""The real servers themselves, straight through the official `openai` client (no proxy).

These pin down what the proxy relies on and what the emulator must imitate: per-request
speculative metrics on the speculative arm only, several tokens per engine step under
speculation (asserted from token counts and vLLM's own step counts, never from how many SSE events
carried them: the API server merges steps whenever it lags), and the V1 spec-decode counters on
/metrics.
"""

from __future__ import annotations

from typing import Any

import aiohttp
import openai
import pytest

from specproxy.records import Arm
from tests.realvllm.conftest import MODEL, Engines

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

PROMPT = "The proxy measures the latency of the speculative server and the baseline"
GREEDY: dict[str, Any] = {"temperature": 0.0, "extra_body": {"ignore_eos": True}}


def client(url: str) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)


def spec_metrics(model_extra: dict[str, Any] | None) -> dict[str, Any] | None:
    metrics = (model_extra or {}).get("metrics") or {}
    spec: dict[str, Any] | None = metrics.get("speculative_decoding")
    return spec


@pytest.mark.parametrize("arm", ["speculative", "baseline"])
async def test_completion_and_chat_nonstream(engines: Engines, arm: Arm) -> None:
    async with client(engines.urls[arm]) as api:
        completion = await api.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=40, **GREEDY
        )
        chat = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=24,
            **GREEDY,
        )
    assert completion.choices[0].text and completion.choices[0].finish_reason == "length"
    assert completion.usage is not None and completion.usage.completion_tokens == 40
    assert chat.choices[0].message.content and chat.choices[0].message.role == "assistant"
    assert chat.usage is not None and chat.usage.completion_tokens == 24
    for reply in (completion, chat):
        extra = reply.model_extra or {}
        assert extra["metrics"]["time_to_first_token_ms"] > 0  # --enable-per-request-metrics
        spec = spec_metrics(extra)
        if arm == "speculative":
            assert spec is not None and spec["num_spec_tokens"] == 4
            assert 0.0 <= spec["draft_acceptance_rate"] <= 1.0
            assert spec["mean_acceptance_length"] >= 1.0
        else:
            assert spec is None


async def test_greedy_output_is_the_same_on_both_arms(engines: Engines) -> None:
    """Same dummy weights and greedy decoding: speculation must not change the text."""
    texts = []
    for arm in ("speculative", "baseline"):
        async with client(engines.urls[arm]) as api:
            reply = await api.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=48, **GREEDY
            )
        texts.append(reply.choices[0].text)
    assert texts[0] == texts[1]


async def test_streaming_chat_with_usage_carries_acceptance(engines: Engines) -> None:
    async with client(engines.speculative_url) as api:
        stream = await api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": PROMPT}],
            max_tokens=48,
            stream=True,
            stream_options={"include_usage": True},
            **GREEDY,
        )
        chunks = [chunk async for chunk in stream]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 48
    spec = spec_metrics(last.model_extra)
    # Speculation emits several tokens per engine step: the engine's own step count says so,
    # not the number of SSE events (vLLM's API server merges steps whenever it lags).
    assert spec is not None and spec["num_accepted_draft_tokens"] > 0
    assert spec["mean_acceptance_length"] > 1.0


async def test_streaming_completion_token_ids_add_up(engines: Engines) -> None:
    """Token counts, never event framing: every token id arrives exactly once on both arms, the
    same ids (greedy), and the speculative arm reports accepted drafts."""
    ids: dict[Arm, list[int]] = {}
    usage: dict[Arm, Any] = {}
    for arm in ("speculative", "baseline"):
        async with client(engines.urls[arm]) as api:
            stream = await api.completions.create(
                model=MODEL,
                prompt=PROMPT,
                max_tokens=48,
                stream=True,
                stream_options={"include_usage": True},
                **GREEDY | {"extra_body": {"ignore_eos": True, "return_token_ids": True}},
            )
            events = [chunk async for chunk in stream]
        ids[arm] = [
            token
            for c in events
            if c.choices
            for token in (c.choices[0].model_extra or {}).get("token_ids") or []
        ]
        usage[arm] = events[-1]
    assert len(ids["speculative"]) == len(ids["baseline"]) == 48
    assert ids["speculative"] == ids["baseline"]
    for arm in ("speculative", "baseline"):
        assert usage[arm].usage is not None and usage[arm].usage.completion_tokens == 48
    spec = spec_metrics(usage["speculative"].model_extra)
    assert spec is not None and spec["num_accepted_draft_tokens"] > 0  # drafts were accepted
    assert spec_metrics(usage["baseline"].model_extra) is None


@pytest.mark.parametrize("stream", [False, True])
async def test_n2(engines: Engines, stream: bool) -> None:
    async with client(engines.speculative_url) as api:
        if stream:
            response = await api.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=16, n=2, temperature=0.8, stream=True
            )
            texts = ["", ""]
            async for chunk in response:
                for choice in chunk.choices:
                    texts[choice.index] += choice.text
        else:
            reply = await api.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=16, n=2, temperature=0.8
            )
            texts = [choice.text for choice in sorted(reply.choices, key=lambda c: c.index)]
            # vLLM reports per-request speculative metrics only when n == 1.
            assert spec_metrics(reply.model_extra) is None
    assert len(texts) == 2 and all(texts)


async def test_metrics_expose_spec_counters_only_on_the_speculative_arm(
    engines: Engines,
) -> None:
    pages = {}
    async with aiohttp.ClientSession() as session:
        for arm in ("speculative", "baseline"):
            async with session.get(f"{engines.urls[arm]}/metrics") as resp:
                pages[arm] = await resp.text()
    spec = pages["speculative"]
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert f"# TYPE vllm:spec_decode_{name}_total counter" in spec
    for position in range(4):
        assert f'position="{position}"' in spec
    assert 'position="4"' not in spec
    assert "process_start_time_seconds" in spec
    assert "vllm:spec_decode" not in pages["baseline"]
    assert "vllm:generation_tokens_total" in pages["baseline"]
