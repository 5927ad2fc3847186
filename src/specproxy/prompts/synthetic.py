"""Synthetic prompts with fixed or distributed input and output lengths (pure).

Like `vllm bench serve --dataset-name random`: `count` prompts of about `input_len` tokens each,
asking for `output_len` tokens, both drawn uniformly from [len * (1 - range_ratio),
len * (1 + range_ratio)] (0: fixed). Words are drawn from a small vocabulary of common English
words that tokenizers encode as one token each (with the leading space), so the prompt length in
tokens is close to `input_len` without loading a tokenizer; the server's usage counts record the
exact figure. Pair with `ignore_eos` so every answer runs to its `max_tokens`.
"""

from __future__ import annotations

import numpy as np

from specproxy.errors import ConfigError
from specproxy.prompts.loader import Prompt

__all__ = ["WORDS", "lengths", "synthetic_prompts"]

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "is",
    "for",
    "on",
    "that",
    "with",
    "as",
    "at",
    "by",
    "from",
    "this",
    "be",
    "are",
    "was",
    "it",
    "or",
    "an",
    "not",
    "but",
    "all",
    "can",
    "will",
    "one",
    "has",
    "more",
    "new",
    "time",
    "were",
    "been",
    "which",
    "their",
    "there",
    "when",
    "would",
    "about",
    "each",
    "other",
    "what",
    "some",
    "into",
    "only",
    "over",
    "such",
    "how",
    "most",
    "also",
    "after",
    "first",
    "year",
    "work",
    "two",
    "people",
    "may",
    "water",
]


def lengths(mean: int, range_ratio: float, count: int, rng: np.random.Generator) -> list[int]:
    """`count` lengths uniform on [mean * (1 - r), mean * (1 + r)], at least 1."""
    if mean < 1:
        raise ConfigError("lengths must be >= 1 token")
    if not 0.0 <= range_ratio < 1.0:
        raise ConfigError("--range-ratio must be in [0, 1)")
    low = max(1, round(mean * (1.0 - range_ratio)))
    high = max(low, round(mean * (1.0 + range_ratio)))
    return [int(v) for v in rng.integers(low, high + 1, size=count)]


def synthetic_prompts(
    count: int, *, input_len: int, output_len: int, range_ratio: float = 0.0, seed: int = 0
) -> list[Prompt]:
    """`count` prompts of about `input_len` tokens, each asking for its `output_len` tokens."""
    if count < 1:
        raise ConfigError("--num-prompts must be >= 1")
    rng = np.random.default_rng(seed)
    inputs = lengths(input_len, range_ratio, count, rng)
    outputs = lengths(output_len, range_ratio, count, rng)
    prompts = []
    for n_in, n_out in zip(inputs, outputs, strict=True):
        words = [WORDS[int(i)] for i in rng.integers(len(WORDS), size=n_in)]
        prompts.append(Prompt(messages=(("user", " ".join(words)),), max_tokens=n_out))
    return prompts
