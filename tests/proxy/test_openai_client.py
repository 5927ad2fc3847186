"""The official `openai` client works through the proxy unchanged, streaming and not."""

from __future__ import annotations

import json

import openai
from openai.types.chat import ChatCompletionMessageParam

from tests.conftest import fixture_path
from tests.proxy.conftest import MakeProxy
from tests.proxy.fake_upstream import fixture_stream


def expected_chat_text() -> str:
    text = ""
    for event in fixture_stream("chat_stream_nousage_spec.sse").split(b"\n\n"):
        if event.startswith(b"data: {"):
            for choice in json.loads(event[6:])["choices"]:
                text += choice["delta"].get("content") or ""
    return text


async def test_openai_client_through_the_proxy(make_proxy: MakeProxy) -> None:
    proxy = await make_proxy(routing={"speculative_share": 1.0})
    base_url = str(proxy.server.make_url("/v1"))
    async with openai.AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0) as client:
        messages: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
        stream = await client.chat.completions.create(
            model="tiny-llama", messages=messages, stream=True, max_tokens=32
        )
        chunks = [chunk async for chunk in stream]
        assert all(chunk.choices for chunk in chunks)  # the injected usage chunk never shows
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected_chat_text()
        assert chunks[-1].choices[0].finish_reason == "length"

        with_usage = await client.chat.completions.create(
            model="tiny-llama",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        last = [chunk async for chunk in with_usage][-1]
        assert last.usage is not None and last.usage.completion_tokens == 32

        reply = await client.chat.completions.create(model="tiny-llama", messages=messages)
        nonstream = json.loads(fixture_path("chat_nonstream_spec.json").read_bytes())
        assert reply.choices[0].message.content == nonstream["choices"][0]["message"]["content"]
        assert reply.usage is not None and reply.usage.completion_tokens == 32

        completion = await client.completions.create(model="tiny-llama", prompt="x")
        assert completion.choices[0].text

        models = await client.models.list()
        assert [m.id for m in models.data] == ["tiny-llama"]
    records = list(proxy.recorder.records)
    assert len(records) == 4  # /v1/models is passed through, not measured
    assert all(r.error_kind is None and r.status == 200 for r in records)
    assert records[0].output_tokens == 32 and records[0].ttft_s is not None
