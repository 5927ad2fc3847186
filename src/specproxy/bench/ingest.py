"""`vllm bench serve --save-result --save-detailed` JSON -> specproxy request records (pure).

So a team can keep its own harness and still get specproxy's statistics and report: run
`vllm bench serve` once against each arm, then `specproxy ingest FILE --arm ARM` each result
into one store run; `specproxy stats` / `report` compare the arms as if the proxy had recorded
them (design split).

The detailed result holds one entry per request in parallel lists (vLLM 0.32.0,
vllm/benchmarks/serve.py): `latencies`, `ttfts`, `itls` (the gaps between streamed chunks),
`input_lens`, `output_lens`, `start_times` and `errors` ("" on success). Mapping:

- e2e_s = latency; ttft_s = ttft; upstream_s = latency (no proxy in between);
- tpot_s = (latency - ttft) / (output_len - 1), vLLM's own TPOT;
- n_events = len(itls) + 1 (one chunk per gap, plus the first), tokens_per_event from it;
- t_start: `start_times` are `time.perf_counter()` values, so they are placed on the wall clock
  by the run's end (`date`, local time, second resolution) minus `duration`: the relative
  spacing is exact, the absolute time within a second or so;
- status 200 on success; a failed request keeps status 0 and error_kind "broken" with its
  latency, as the proxy records a broken upstream;
- endpoint from `backend` ("openai-chat" -> chat.completions, else completions); stream True
  (vllm bench serve streams).

A result saved without --save-detailed has no per-request lists and is refused: summaries
cannot be resampled.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from specproxy.errors import ConfigError, ErrorKind
from specproxy.records import Arm, RequestRecord

__all__ = ["DETAILED_FIELDS", "records_from_vllm_bench"]

DETAILED_FIELDS = ("latencies", "ttfts", "itls", "input_lens", "output_lens", "start_times")


def _wall_start(result: Mapping[str, Any]) -> float:
    """Unix time of the run's first request: `date` (its end) minus `duration`."""
    date = result.get("date")
    duration = float(result.get("duration") or 0.0)
    try:
        end = dt.datetime.strptime(str(date), "%Y%m%d-%H%M%S").timestamp()
    except ValueError as exc:
        raise ConfigError(f"vllm bench result has no usable 'date': {date!r}") from exc
    return end - duration


def records_from_vllm_bench(
    result: Mapping[str, Any], *, arm: Arm, run_id: str, model: str | None = None
) -> list[RequestRecord]:
    """One record per request of a detailed `vllm bench serve` result."""
    missing = [f for f in DETAILED_FIELDS if not isinstance(result.get(f), list)]
    if missing:
        raise ConfigError(
            "not a detailed vllm bench serve result (run it with --save-result --save-detailed);"
            f" missing: {', '.join(missing)}"
        )
    lists: dict[str, Sequence[Any]] = {f: result[f] for f in DETAILED_FIELDS}
    count = len(lists["latencies"])
    if any(len(values) != count for values in lists.values()):
        raise ConfigError("vllm bench result: the per-request lists differ in length")
    errors: Sequence[Any] = result.get("errors") or [""] * count
    starts = [float(s) for s in lists["start_times"]]
    origin = _wall_start(result) - (min(starts) if starts else 0.0)
    endpoint = "chat.completions" if "chat" in str(result.get("backend", "")) else "completions"
    name = model or str(result.get("model_id") or "unknown")
    digest = hashlib.sha1(f"{run_id}|{arm}|{result.get('date')}".encode()).hexdigest()[:12]
    records = []
    for i in range(count):
        latency = float(lists["latencies"][i])
        ok = not errors[i]
        ttft = float(lists["ttfts"][i]) if ok else None
        output = int(lists["output_lens"][i]) if ok else None
        events = len(lists["itls"][i]) + 1 if ok else 0
        tpot = None
        if ttft is not None and output is not None and output > 1:
            tpot = (latency - ttft) / (output - 1)
        records.append(
            RequestRecord(
                request_id=f"vllm-bench-{digest}-{i}",
                run_id=run_id,
                arm=arm,
                t_start=origin + starts[i],
                model=name,
                endpoint=endpoint,
                stream=True,
                status=200 if ok else 0,
                e2e_s=latency,
                upstream_s=latency,
                ttft_s=ttft,
                tpot_s=tpot,
                prompt_tokens=int(lists["input_lens"][i]),
                output_tokens=output,
                n_events=events,
                tokens_per_event=output / events if output is not None and events else None,
                error_kind=None if ok else ErrorKind.BROKEN,
            )
        )
    return records
