"""The artificial workload of the real-engine tier, and a direct (proxy-free) latency measurement.

The direct measurement is the yardstick the proxy's statistics are checked against: the same
prompts are sent to both servers at concurrency 1, alternating arms (which arm goes first flips
each round) so that slow drifts of a shared 2-core machine hit both arms alike.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from specproxy.realvllm.model_dir import (
    SERVED_MODEL_NAME,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    corpus_lines,
)
from specproxy.records import SHORTHAND_ARMS, Arm

__all__ = [
    "DirectResult",
    "completion_body",
    "measure_direct",
    "prompts",
    "random_token_prompts",
    "timed_completion",
]


def prompts(count: int, *, seed: int = 7, min_words: int = 5, max_words: int = 60) -> list[str]:
    """`count` prompts of `min_words`-`max_words` words drawn from the tokenizer's own corpus."""
    rng = random.Random(seed)
    words = " ".join(corpus_lines()).split()
    out = []
    for _ in range(count):
        length = rng.randint(min_words, max_words)
        start = rng.randrange(len(words) - length)
        out.append(" ".join(words[start : start + length]))
    return out


def random_token_prompts(count: int, length: int, *, seed: int = 7) -> list[list[int]]:
    """`count` prompts of `length` distinct random token ids (special tokens excluded), for the
    completions endpoint's token-id prompt form: no token repeats, so an n-gram proposer finds
    nothing in the prompt to copy. Sampled at temperature 1, the dummy-weight model's answers
    are near-uniform over the vocabulary and repeat no n-gram either, so it proposes no drafts;
    greedy answers fall into loops that it does copy."""
    first = len(SPECIAL_TOKENS)
    if not 0 < length <= VOCAB_SIZE - first:
        raise ValueError(f"length must be in [1, {VOCAB_SIZE - first}]")
    rng = random.Random(seed)
    return [rng.sample(range(first, VOCAB_SIZE), length) for _ in range(count)]


def completion_body(prompt: str | list[int], *, max_tokens: int, **extra: Any) -> dict[str, Any]:
    """A greedy /v1/completions body that always runs to `max_tokens` (no early EOS)."""
    return {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        **extra,
    }


async def timed_completion(
    session: aiohttp.ClientSession, base_url: str, prompt: str, *, max_tokens: int
) -> tuple[float, dict[str, Any]]:
    """Seconds from sending a non-streaming completion to its full body, and the parsed body."""
    body = completion_body(prompt, max_tokens=max_tokens)
    started = time.perf_counter()
    async with session.post(f"{base_url}/v1/completions", json=body) as resp:
        payload: dict[str, Any] = await resp.json()
        resp.raise_for_status()
    return time.perf_counter() - started, payload


@dataclass(frozen=True, slots=True)
class DirectResult:
    """Per-arm latencies (seconds, in send order) and the ratio of medians baseline/speculative."""

    latencies: dict[Arm, list[float]]
    acceptance_rates: list[float]

    def median(self, arm: Arm) -> float:
        return statistics.median(self.latencies[arm])

    @property
    def speedup(self) -> float:
        return self.median("baseline") / self.median("speculative")


async def measure_direct(
    session: aiohttp.ClientSession,
    urls: Mapping[Arm, str],
    prompt_list: Sequence[str],
    *,
    max_tokens: int,
    warmup: int = 2,
) -> DirectResult:
    """Interleaved concurrency-1 measurement of both arms; the first `warmup` rounds are dropped."""
    latencies: dict[Arm, list[float]] = {arm: [] for arm in SHORTHAND_ARMS}
    acceptance: list[float] = []
    for i, prompt in enumerate(prompt_list):
        order = ("speculative", "baseline") if i % 2 == 0 else ("baseline", "speculative")
        for arm in order:
            seconds, payload = await timed_completion(
                session, urls[arm], prompt, max_tokens=max_tokens
            )
            if i < warmup:
                continue
            latencies[arm].append(seconds)
            spec = (payload.get("metrics") or {}).get("speculative_decoding")
            if arm == "speculative" and spec:
                acceptance.append(float(spec["draft_acceptance_rate"]))
    return DirectResult(latencies=latencies, acceptance_rates=acceptance)
