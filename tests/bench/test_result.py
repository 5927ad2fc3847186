"""`bench.result`: each arm's figures under `vllm bench serve`'s result-JSON names."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specproxy.bench.result import arm_result, result_filename, setup_fields
from specproxy.records import SHORTHAND_CONTROL
from tests.bench.test_summary import _result


def test_arm_result_uses_vllms_names_and_meanings() -> None:
    # three requests of 100, 200, 300 ms sent at t = 0, 0.1, 0.2: the arm ran 0.5 s
    rows = [
        replace(_result(SHORTHAND_CONTROL, ms), t_start=t)
        for ms, t in ((100.0, 0.0), (200.0, 0.1), (300.0, 0.2))
    ]
    rows.append(replace(_result(SHORTHAND_CONTROL, 1.0, ok=False), t_start=0.0))
    out = arm_result(rows, {"e2el": 250.0})
    assert out["duration"] == pytest.approx(0.5)
    assert out["completed"] == 3 and out["failed"] == 1
    assert out["total_output_tokens"] == 27  # 9 each
    assert out["request_throughput"] == pytest.approx(3 / 0.5)
    assert out["request_goodput"] == pytest.approx(2 / 0.5)  # 100 and 200 ms within 250
    assert out["output_throughput"] == pytest.approx(27 / 0.5)
    assert out["median_e2el_ms"] == pytest.approx(200.0)
    assert out["mean_ttft_ms"] == pytest.approx(20.0)  # TTFT is e2e / 10 in the helper
    # vLLM's TPOT: (latency - TTFT) / (output tokens - 1)
    assert out["median_tpot_ms"] == pytest.approx(200.0 * 0.9 / 8)
    assert {"std_ttft_ms", "p99_ttft_ms", "p99_tpot_ms", "p99_e2el_ms"} <= set(out)
    assert arm_result(rows, {})["request_goodput"] is None  # vLLM: None without --goodput


def test_setup_and_file_name_follow_vllm() -> None:
    closed = setup_fields(
        date="20261204-131500",
        endpoint="chat.completions",
        model="org/tiny",
        num_prompts=100,
        rate=None,
        burstiness=1.0,
        concurrency=8,
    )
    assert closed["request_rate"] == "inf" and closed["max_concurrency"] == 8
    assert closed["backend"] == "openai-chat" and closed["model_id"] == "org/tiny"
    name = result_filename(model="org/tiny", date="20261204-131500", rate=None, concurrency=8)
    assert name == "specproxy-bench-infqps-concurrency8-tiny-20261204-131500.json"
    assert (
        result_filename(model="m", date="d", rate=2.5, concurrency=None)
        == "specproxy-bench-2.5qps-m-d.json"
    )
