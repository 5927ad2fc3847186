"""`specproxy bench --save-result`: each arm's figures under `vllm bench serve`'s result names.

The field names and their meaning follow vLLM 0.32's `vllm/benchmarks/serve.py`: the run's
setup (`date`, `backend`, `label`, `model_id`, `num_prompts`, `request_rate` ("inf" for a closed
loop), `burstiness`, `max_concurrency`; `main` there), and per benchmark (`benchmark`'s `result`
and `process_one_metric`): `duration`, `completed`, `failed`, `total_input_tokens`,
`total_output_tokens`, `request_throughput`, `request_goodput` (None without `--goodput`),
`output_throughput`, `total_token_throughput`, and `mean_`/`median_`/`std_`/`p99_` of
`ttft_ms`, `tpot_ms` and `e2el_ms`. vLLM runs one endpoint; here each arm is one such benchmark,
under `blocks[i].arms[name]`, over its own duration (its first send to its last byte). TPOT is
vLLM's (latency - TTFT) / (output tokens - 1), from requests with more than one output token.
The file name is vLLM's default, `{label}-{request_rate}qps[-concurrency{N}]-{model}-{date}.json`.
Pure: the CLI writes the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from specproxy.bench.summary import is_good
from specproxy.loadgen import ClientResult

__all__ = ["LABEL", "arm_result", "result_filename", "setup_fields"]

LABEL = "specproxy-bench"  # vLLM's `label` (its default is the backend's name)
_PERCENTILES = (99,)  # vLLM's default --metric-percentiles


def setup_fields(
    *,
    date: str,
    endpoint: str,
    model: str,
    num_prompts: int,
    rate: float | None,
    burstiness: float,
    concurrency: int | None,
) -> dict[str, Any]:
    """The run's setup as vLLM writes it (`backend`: its name for the endpoint type)."""
    return {
        "date": date,
        "backend": "openai-chat" if endpoint == "chat.completions" else "openai",
        "label": LABEL,
        "model_id": model,
        "num_prompts": num_prompts,
        "request_rate": rate if rate is not None else "inf",
        "burstiness": burstiness,
        "max_concurrency": concurrency,
    }


def arm_result(rows: Sequence[ClientResult], goodput_ms: dict[str, float]) -> dict[str, Any]:
    """One arm's results as one vLLM benchmark result (times in ms, rates per second)."""
    ok = [r for r in rows if r.ok]
    duration = (
        max(r.t_start + r.measures.e2e_s for r in rows) - min(r.t_start for r in rows)
        if rows
        else 0.0
    )
    per_s = 1.0 / duration if duration > 0 else float("nan")
    total_in = sum(r.measures.prompt_tokens or 0 for r in ok)
    total_out = sum(r.measures.output_tokens or 0 for r in ok)
    ttfts = [r.measures.ttft_s for r in ok if r.measures.ttft_s is not None]
    tpots = [
        (m.e2e_s - m.ttft_s) / (m.output_tokens - 1)
        for m in (r.measures for r in ok)
        if m.ttft_s is not None and m.output_tokens is not None and m.output_tokens > 1
    ]
    slo = {name: ms / 1e3 for name, ms in goodput_ms.items()}
    out: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(rows) - len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) * per_s,
        "request_goodput": sum(is_good(r, slo) for r in ok) * per_s if slo else None,
        "output_throughput": total_out * per_s,
        "total_token_throughput": (total_in + total_out) * per_s,
    }
    for name, values in (
        ("ttft", ttfts),
        ("tpot", tpots),
        ("e2el", [r.measures.e2e_s for r in ok]),
    ):
        out |= _stats(name, values)
    return out


def result_filename(
    *, model: str, date: str, rate: float | None, concurrency: int | None, label: str = LABEL
) -> str:
    """vLLM's default result file name (`compute_result_filename`)."""
    rate_text = f"{rate}" if rate is not None else "inf"
    clients = f"-concurrency{concurrency}" if concurrency is not None else ""
    return f"{label}-{rate_text}qps{clients}-{model.split('/')[-1]}-{date}.json"


def _stats(name: str, seconds: Sequence[float]) -> dict[str, float]:
    """vLLM's mean/median/std/pNN of one metric in milliseconds (0 without values, as there)."""
    ms = np.asarray(seconds or [0.0], dtype=np.float64) * 1e3
    out = {
        f"mean_{name}_ms": float(np.mean(ms)),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(np.std(ms)),
    }
    for p in _PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(ms, p))
    return out
