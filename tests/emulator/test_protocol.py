"""Request validation details that the HTTP-level tests do not pin down."""

from __future__ import annotations

import json

import pytest

from specproxy.emulator import vocab
from specproxy.emulator.protocol import RequestError, parse_request


def parse(endpoint: str, body: object) -> object:
    raw = json.dumps(body).encode()
    return parse_request(endpoint, raw, served_model="m", max_model_len=64)  # type: ignore[arg-type]


def test_prompt_forms() -> None:
    req = parse("completions", {"prompt": ["a b", [5, 6, 7]], "n": 2, "model": "m"})
    assert req.prompts == (tuple(vocab.encode("a b")), (5, 6, 7))  # type: ignore[attr-defined]
    assert req.num_choices == 4  # type: ignore[attr-defined]
    assert parse("completions", {"prompt": [1, 2]}).prompts == ((1, 2),)  # type: ignore[attr-defined]


def test_chat_content_parts_and_max_completion_tokens() -> None:
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "max_completion_tokens": 7,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    req = parse("chat", body)
    assert req.max_tokens == 7 and req.include_usage  # type: ignore[attr-defined]


def test_context_overflow_names_the_lengths() -> None:
    with pytest.raises(RequestError) as info:
        parse("completions", {"prompt": list(range(60)), "max_tokens": 10})
    assert info.value.status == 400
    assert "maximum context length is 64" in str(info.value)


def test_vocab_is_deterministic_and_decodable() -> None:
    assert vocab.encode("hello world") == vocab.encode("hello world")
    assert vocab.VOCAB_SIZE == 2048
    assert vocab.decode([vocab.VOCAB.index(" the"), vocab.VOCAB.index(".")]) == " the."
    assert vocab.chat_prompt_ids([("user", "hi")])[0] == 1
