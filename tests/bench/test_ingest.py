"""`vllm bench serve --save-detailed` results -> request records (`bench.ingest`)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pytest

from specproxy.bench.ingest import records_from_vllm_bench
from specproxy.errors import ConfigError
from specproxy.records import Arm

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm-0.32.0-cpu"


def detailed(**overrides: Any) -> dict[str, Any]:
    """The shape vllm/benchmarks/serve.py (0.32.0) saves, three requests, one failed."""
    result: dict[str, Any] = {
        "date": "20261201-040000",
        "backend": "openai",
        "model_id": "tiny-llama",
        "duration": 2.0,
        "latencies": [0.5, 0.6, 0.05],
        "ttfts": [0.1, 0.12, 0.0],
        "itls": [[0.1, 0.1, 0.2], [0.2, 0.28], []],
        "input_lens": [16, 16, 16],
        "output_lens": [9, 5, 0],
        "start_times": [1000.0, 1000.5, 1001.0],
        "errors": ["", "", "Bad Request"],
    }
    result.update(overrides)
    return result


def test_records_map_vllm_timings() -> None:
    ok, second, failed = records_from_vllm_bench(detailed(), arm="speculative", run_id="r")
    start = dt.datetime(2026, 12, 1, 4, 0, 0).timestamp() - 2.0
    assert ok.t_start == pytest.approx(start) and second.t_start == pytest.approx(start + 0.5)
    assert (ok.e2e_s, ok.ttft_s, ok.output_tokens, ok.prompt_tokens) == (0.5, 0.1, 9, 16)
    assert ok.tpot_s == pytest.approx((0.5 - 0.1) / 8)  # vLLM's TPOT definition
    assert ok.n_events == 4 and ok.tokens_per_event == pytest.approx(9 / 4)
    assert ok.endpoint == "completions" and ok.stream and ok.model == "tiny-llama"
    assert ok.status == 200 and ok.error_kind is None and ok.arm == "speculative"
    assert failed.status == 0 and failed.error_kind == "broken" and failed.ttft_s is None
    assert len({ok.request_id, second.request_id, failed.request_id}) == 3


def test_chat_backend_and_model_override() -> None:
    records = records_from_vllm_bench(
        detailed(backend="openai-chat"), arm="baseline", run_id="r", model="m"
    )
    assert {r.endpoint for r in records} == {"chat.completions"}
    assert {r.model for r in records} == {"m"}


def test_results_without_per_request_lists_are_refused() -> None:
    summary_only = detailed()
    for field in ("latencies", "ttfts", "itls", "start_times"):
        del summary_only[field]
    with pytest.raises(ConfigError, match="--save-detailed"):
        records_from_vllm_bench(summary_only, arm="baseline", run_id="r")
    with pytest.raises(ConfigError, match="differ in length"):
        records_from_vllm_bench(detailed(ttfts=[0.1]), arm="baseline", run_id="r")


@pytest.mark.parametrize("arm", ["speculative", "baseline"])
def test_a_real_vllm_bench_result_matches_vllms_own_summary(arm: Arm) -> None:
    """The verbatim result vllm bench serve 0.32.0 saved against the real engines: the records
    reproduce the figures vLLM printed for the same requests."""
    import json
    import statistics

    result = json.loads((FIXTURES / f"vllm_bench_serve_{arm}.json").read_text())
    records = records_from_vllm_bench(result, arm=arm, run_id="r")
    assert len(records) == result["completed"] == result["num_prompts"]
    assert all(r.status == 200 for r in records)
    assert sum(r.output_tokens or 0 for r in records) == result["total_output_tokens"]
    assert sum(r.prompt_tokens or 0 for r in records) == result["total_input_tokens"]
    ttft = statistics.median(r.ttft_s for r in records if r.ttft_s is not None)
    assert ttft * 1e3 == pytest.approx(result["median_ttft_ms"], rel=1e-9)
    tpot = statistics.mean(r.tpot_s for r in records if r.tpot_s is not None)
    assert tpot * 1e3 == pytest.approx(result["mean_tpot_ms"], rel=1e-9)  # vLLM's TPOT
    span = max(r.t_start for r in records) - min(r.t_start for r in records)
    assert 0 < span <= result["duration"]
    assert {r.model for r in records} == {result["model_id"]}
