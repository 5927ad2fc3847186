"""Prompt sets for the demo and the bench harness, read from JSONL.

Latency depends on prompt and output length, so a load test with one fixed prompt says little
about a real service. The package ships `default.jsonl` (written for specproxy: short questions,
medium instructions, long passages and multi-turn chats, with output budgets from 16 to 512
tokens), and `load_prompts` reads the three common formats, one JSON object per line:

- plain: `{"prompt": "...", "max_tokens": 64}`
- chat: `{"messages": [{"role": "user", "content": "..."}], "max_tokens": 64}`
- ShareGPT: `{"conversations": [{"from": "human", "value": "..."}, {"from": "gpt", ...}]}`;
  the conversation up to its last human turn is the prompt, and the length of the reply that
  follows (if any) sets the output budget, as `vllm bench serve` does.

`specbench.jsonl` (`specbench_prompts`, `specproxy bench --dataset specbench`) is a SpecBench-like
set written for specproxy (so it is under the project's licence): six prompts in each of eight
categories (coding, math, writing, qa, summarization, translation, reasoning, extraction), since
draft acceptance, and so the speedup, differs by domain.

Any row may carry a `category` (a short label such as "coding" or "math": at most 64 characters
of letters, digits and `_.-/`); `specproxy bench` sends it with each request in the
`x-specproxy-category` header, so the proxy's per-category figures can be read off a bench run.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Any

from specproxy.errors import ConfigError

__all__ = [
    "CATEGORY_MAX",
    "DEFAULT_MAX_TOKENS",
    "Prompt",
    "default_prompts",
    "load_prompts",
    "parse_prompts",
]

DEFAULT_MAX_TOKENS = 128
_SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
_SHAREGPT_ROLES |= {"system": "system", "chatgpt": "assistant", "bard": "assistant"}
_MAX_SHAREGPT_TOKENS = 1024
CATEGORY_MAX = 64
_CATEGORY = re.compile(rf"[A-Za-z0-9_./-]{{1,{CATEGORY_MAX}}}")


@dataclass(frozen=True, slots=True)
class Prompt:
    """One prompt as chat messages, with the output budget it asks for."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    max_tokens: int = DEFAULT_MAX_TOKENS
    category: str | None = None  # the dataset's label for the prompt (coding, math, ...)

    def chat_messages(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]

    def text(self) -> str:
        """A single prompt string for /v1/completions (turns joined by blank lines)."""
        if len(self.messages) == 1:
            return self.messages[0][1]
        return "\n\n".join(f"{role}: {content}" for role, content in self.messages)


def parse_prompts(lines: Iterable[str], *, source: str = "<prompts>") -> list[Prompt]:
    """Parse JSONL lines; blank lines are skipped, anything else malformed is a ConfigError."""
    prompts: list[Prompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{source} line {number}: not valid JSON ({exc.msg})") from exc
        if not isinstance(row, Mapping):
            raise ConfigError(f"{source} line {number}: expected a JSON object")
        try:
            prompts.append(_parse_row(row))
        except (TypeError, ValueError, KeyError) as exc:
            raise ConfigError(f"{source} line {number}: {exc}") from exc
    if not prompts:
        raise ConfigError(f"{source} holds no prompts")
    return prompts


def load_prompts(path: str | Path | None = None) -> list[Prompt]:
    """Prompts from a JSONL file, or the packaged default set when `path` is None."""
    if path is None:
        return default_prompts()
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read prompts file {path}: {exc.strerror}") from exc
    return parse_prompts(text.splitlines(), source=str(path))


def default_prompts() -> list[Prompt]:
    """The prompt set shipped with the package (no download)."""
    return _packaged("default.jsonl")


def specbench_prompts() -> list[Prompt]:
    """The packaged categorized set (eight categories, six prompts each; no download)."""
    return _packaged("specbench.jsonl")


def _packaged(name: str) -> list[Prompt]:
    text = resources.files("specproxy.prompts").joinpath(name).read_text(encoding="utf-8")
    return parse_prompts(text.splitlines(), source=name)


def _parse_row(row: Mapping[str, Any]) -> Prompt:
    category = row.get("category")
    if category is not None and not (isinstance(category, str) and _CATEGORY.fullmatch(category)):
        raise ValueError(
            f"category must be up to {CATEGORY_MAX} letters, digits or _.-/, got {category!r}"
        )
    return replace(_parse_prompt(row), category=category)


def _parse_prompt(row: Mapping[str, Any]) -> Prompt:
    max_tokens = row.get("max_tokens", DEFAULT_MAX_TOKENS)
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ValueError(f"max_tokens must be a positive integer, got {max_tokens!r}")
    if "conversations" in row:
        return _parse_sharegpt(row["conversations"], row.get("max_tokens"))
    if "messages" in row:
        messages = row["messages"]
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        pairs = tuple(_message(m, "role", "content", {}) for m in messages)
        return Prompt(pairs, max_tokens)
    if "prompt" in row:
        text = row["prompt"]
        if not isinstance(text, str) or not text:
            raise ValueError("prompt must be a non-empty string")
        return Prompt((("user", text),), max_tokens)
    raise ValueError("expected one of the keys prompt, messages or conversations")


def _parse_sharegpt(turns: Any, max_tokens: Any) -> Prompt:
    if not isinstance(turns, list) or not turns:
        raise ValueError("conversations must be a non-empty list")
    pairs = [_message(t, "from", "value", _SHAREGPT_ROLES) for t in turns]
    last_user = max((i for i, (role, _) in enumerate(pairs) if role == "user"), default=-1)
    if last_user < 0:
        raise ValueError("conversation has no human turn")
    if max_tokens is None:
        reply = pairs[last_user + 1][1] if last_user + 1 < len(pairs) else ""
        # About 1.3 tokens per English word; a missing reply keeps the default budget.
        words = len(reply.split())
        max_tokens = min(_MAX_SHAREGPT_TOKENS, round(words * 1.3)) if words else DEFAULT_MAX_TOKENS
    return Prompt(tuple(pairs[: last_user + 1]), max(1, int(max_tokens)))


def _message(
    item: Any, role_key: str, content_key: str, roles: Mapping[str, str]
) -> tuple[str, str]:
    if not isinstance(item, Mapping):
        raise ValueError(f"each turn must be an object with {role_key!r} and {content_key!r}")
    role, content = item.get(role_key), item.get(content_key)
    if not isinstance(role, str) or not isinstance(content, str):
        raise ValueError(f"each turn needs string {role_key!r} and {content_key!r}")
    if roles:
        if role.lower() not in roles:
            raise ValueError(f"unknown ShareGPT speaker {role!r}")
        role = roles[role.lower()]
    return role, content
