"""`bench.result`: each arm's figures under `vllm bench serve`'s result-JSON names."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from specproxy.bench.result import arm_result, result_filename, setup_fields
from specproxy.records import SHORTHAND_CONTROL
from tests.bench.test_summary import _result

# verbatim `vllm bench serve --save-result` files of vLLM 0.32.0 (tests/fixtures/.../README.md)
VLLM_RESULTS = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-cpu"


def closed_loop_setup(
    endpoint: str, model: str, *, num_prompts: int, concurrency: int
) -> dict[str, Any]:
    """`setup_fields` of a closed-loop run dated 2026-12-04 13:15:00."""
    return setup_fields(
        date="20261204-131500",
        endpoint=endpoint,
        model=model,
        num_prompts=num_prompts,
        rate=None,
        burstiness=1.0,
        concurrency=concurrency,
    )


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
    closed = closed_loop_setup("chat.completions", "org/tiny", num_prompts=100, concurrency=8)
    assert closed["request_rate"] == "inf" and closed["max_concurrency"] == 8
    assert closed["backend"] == "openai-chat" and closed["model_id"] == "org/tiny"
    name = result_filename(model="org/tiny", date="20261204-131500", rate=None, concurrency=8)
    assert name == "specproxy-bench-infqps-concurrency8-tiny-20261204-131500.json"
    assert (
        result_filename(model="m", date="d", rate=2.5, concurrency=None)
        == "specproxy-bench-2.5qps-m-d.json"
    )


@pytest.mark.parametrize("arm", ["baseline", "speculative"])
def test_every_name_is_one_vllm_itself_writes_with_the_same_type(arm: str) -> None:
    """Against vLLM's own saved result, not a list copied from its source: each setup and arm
    field specproxy writes is a field of vLLM's file, holding a value of the same JSON type.
    vLLM writes e2el figures only with `--percentile-metrics e2el` (that run had its default,
    ttft,tpot,itl), so they are held to the names of its ttft figures instead."""
    vllm = json.loads((VLLM_RESULTS / f"vllm_bench_serve_{arm}.json").read_text())
    ours = closed_loop_setup("completions", "tiny-llama", num_prompts=24, concurrency=2)
    rows = [replace(_result(SHORTHAND_CONTROL, ms), t_start=0.0) for ms in (100.0, 200.0)]
    ours |= arm_result(rows, {"ttft": 500.0})
    for name, value in ours.items():
        if name == "label":  # vLLM's default label is None (the backend's name in the file name)
            assert vllm[name] is None and isinstance(value, str)
            continue
        theirs = vllm[name.replace("_e2el_", "_ttft_")]
        if name == "request_goodput":  # None there: that run had no --goodput
            assert theirs is None and isinstance(value, float)
            continue
        assert type(value) is type(theirs) or {type(value), type(theirs)} == {int, float}, name
    assert {k: ours[k] for k in ("backend", "request_rate", "max_concurrency")} == {
        k: vllm[k] for k in ("backend", "request_rate", "max_concurrency")
    }
