"""The warm-up rule (`bench.warmup`): windows of latency per token until two agree."""

from __future__ import annotations

import pytest

from specproxy.bench.warmup import is_stable, per_token_latency


def test_warmup_rule() -> None:
    cold = [10.0] * 10 + [1.0] * 10
    assert not is_stable(cold, window=10)  # the first window was slow
    assert is_stable([*cold, *([1.02] * 10)], window=10)  # two warm windows agree
    assert not is_stable([1.0] * 19, window=10)  # not enough data yet
    assert per_token_latency(2.0, 100) == pytest.approx(0.02)
    assert per_token_latency(2.0, None) == 2.0
    with pytest.raises(ValueError, match="window"):
        is_stable([1.0], window=0)
