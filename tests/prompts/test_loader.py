"""The prompt loader: the shipped set and the three JSONL formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specproxy.errors import ConfigError
from specproxy.prompts import DEFAULT_MAX_TOKENS, default_prompts, load_prompts, parse_prompts


def test_default_set_has_varied_lengths() -> None:
    prompts = default_prompts()
    assert len(prompts) >= 20
    lengths = [len(p.text()) for p in prompts]
    assert max(lengths) > 10 * min(lengths)  # short questions and long passages
    budgets = {p.max_tokens for p in prompts}
    assert min(budgets) <= 32 and max(budgets) >= 256
    assert any(len(p.messages) > 1 for p in prompts)  # a multi-turn chat


def test_three_formats() -> None:
    lines = [
        json.dumps({"prompt": "hello", "max_tokens": 7}),
        "",
        json.dumps(
            {"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}
        ),
        json.dumps(
            {
                "conversations": [
                    {"from": "human", "value": "first"},
                    {"from": "gpt", "value": "reply"},
                    {"from": "human", "value": "second"},
                    {"from": "gpt", "value": " ".join(["w"] * 10)},
                ]
            }
        ),
    ]
    plain, chat, share = parse_prompts(lines)
    assert plain.chat_messages() == [{"role": "user", "content": "hello"}]
    assert plain.max_tokens == 7 and plain.text() == "hello"
    assert chat.messages == (("system", "s"), ("user", "u"))
    assert chat.max_tokens == DEFAULT_MAX_TOKENS
    # The prompt stops at the last human turn; the reply's length sets the budget.
    assert share.messages == (("user", "first"), ("assistant", "reply"), ("user", "second"))
    assert share.max_tokens == 13


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("not json", "line 1: not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"other": 1}', "expected one of the keys"),
        ('{"prompt": "x", "max_tokens": 0}', "max_tokens must be a positive integer"),
        ('{"messages": []}', "non-empty list"),
        ('{"conversations": [{"from": "gpt", "value": "x"}]}', "no human turn"),
        ('{"conversations": [{"from": "alien", "value": "x"}]}', "unknown ShareGPT speaker"),
    ],
)
def test_bad_lines_are_config_errors(line: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_prompts([line])


def test_load_from_file_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "a"}\n{"prompt": "b"}\n')
    assert [p.text() for p in load_prompts(path)] == ["a", "b"]
    with pytest.raises(ConfigError, match="cannot read prompts file"):
        load_prompts(tmp_path / "missing.jsonl")
    path.write_text("\n\n")
    with pytest.raises(ConfigError, match="holds no prompts"):
        load_prompts(path)


def test_rows_carry_a_bounded_category() -> None:
    from specproxy.prompts import parse_prompts

    (p,) = parse_prompts(['{"prompt": "2+2?", "category": "math"}'])
    assert p.category == "math"
    (q,) = parse_prompts(['{"prompt": "hi"}'])
    assert q.category is None
    for bad in ('"x y"', '""', f'"{"a" * 65}"', "3"):
        with pytest.raises(ConfigError, match="category must be"):
            parse_prompts([f'{{"prompt": "hi", "category": {bad}}}'])


def test_the_specbench_set_covers_eight_categories() -> None:
    from collections import Counter

    from specproxy.prompts import specbench_prompts

    counts = Counter(p.category for p in specbench_prompts())
    assert counts == {
        c: 6
        for c in (
            "coding",
            "math",
            "writing",
            "qa",
            "summarization",
            "translation",
            "reasoning",
            "extraction",
        )
    }
