"""Prompt sets for the demo and the bench harness: the packaged `default.jsonl` and
`specbench.jsonl`, and JSONL readers.

The readers live in `loader`; this package re-exports them and holds the data file.
"""

from specproxy.prompts.loader import (
    DEFAULT_MAX_TOKENS,
    Prompt,
    default_prompts,
    load_prompts,
    parse_prompts,
    specbench_prompts,
)

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "Prompt",
    "default_prompts",
    "load_prompts",
    "parse_prompts",
    "specbench_prompts",
]
