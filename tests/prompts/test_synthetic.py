"""Synthetic prompts (`prompts.synthetic`): fixed or distributed lengths, reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from specproxy.errors import ConfigError
from specproxy.loadgen import RequestOptions
from specproxy.prompts.synthetic import lengths, synthetic_prompts


def test_fixed_lengths() -> None:
    prompts = synthetic_prompts(20, input_len=32, output_len=16, seed=3)
    assert len(prompts) == 20
    assert all(p.max_tokens == 16 for p in prompts)
    assert all(len(p.text().split()) == 32 for p in prompts)  # one word ~ one token
    assert synthetic_prompts(20, input_len=32, output_len=16, seed=3) == prompts


def test_distributed_lengths_stay_in_their_range() -> None:
    values = lengths(100, 0.5, 2000, np.random.default_rng(0))
    assert min(values) >= 50 and max(values) <= 150
    assert min(values) < 60 and max(values) > 140  # spread over the range, not fixed
    prompts = synthetic_prompts(200, input_len=40, output_len=20, range_ratio=0.5, seed=1)
    assert {10 <= p.max_tokens <= 30 for p in prompts} == {True}
    assert len({p.max_tokens for p in prompts}) > 5


def test_bad_lengths_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="range-ratio"):
        synthetic_prompts(1, input_len=8, output_len=8, range_ratio=1.0)
    with pytest.raises(ConfigError, match=">= 1"):
        synthetic_prompts(1, input_len=0, output_len=8)


def test_ignore_eos_reaches_the_request_body() -> None:
    (prompt,) = synthetic_prompts(1, input_len=4, output_len=8)
    body = RequestOptions(model="m", endpoint="completions", ignore_eos=True).body(prompt)
    assert body["ignore_eos"] is True and body["max_tokens"] == 8
    assert "ignore_eos" not in RequestOptions(model="m").body(prompt)
