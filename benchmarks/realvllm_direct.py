"""Direct speedup of real vLLM CPU speculative decoding, measured without the proxy.

Prints each arm's median latency at concurrency 1 (same prompts, interleaved, after warm-up),
the ratio of medians, the per-request acceptance and the /metrics spec counters. Either give
running servers (`--speculative-url`, `--baseline-url`) or let it start them:

    .venv/bin/python benchmarks/realvllm_direct.py --vllm-python .venv-vllm/bin/python
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from specproxy.realvllm.launcher import VllmPair, resolve_vllm_python
from specproxy.realvllm.workload import measure_direct, prompts
from specproxy.records import Arm


async def _measure(urls: dict[Arm, str], count: int, max_tokens: int, warmup: int) -> None:
    async with aiohttp.ClientSession() as session:
        result = await measure_direct(
            session, urls, prompts(count + warmup), max_tokens=max_tokens, warmup=warmup
        )
        async with session.get(f"{urls['speculative']}/metrics") as resp:
            metrics = await resp.text()
    for arm in ("speculative", "baseline"):
        lat = sorted(result.latencies[arm])
        p90 = lat[int(0.9 * (len(lat) - 1))]
        median_ms = result.median(arm) * 1e3
        print(f"{arm:12s} n={len(lat)} median={median_ms:.1f} ms p90={p90 * 1e3:.1f} ms")
    print(f"speedup (ratio of medians, baseline/speculative): {result.speedup:.2f}x")
    if result.acceptance_rates:
        print(
            f"per-request draft acceptance: median {statistics.median(result.acceptance_rates):.3f}"
        )
    for line in metrics.splitlines():
        if line.startswith("vllm:spec_decode_num") and "_created" not in line:
            print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speculative-url")
    parser.add_argument("--baseline-url")
    parser.add_argument("--vllm-python")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()
    if args.speculative_url and args.baseline_url:
        urls = {"speculative": args.speculative_url, "baseline": args.baseline_url}
        asyncio.run(_measure(urls, args.requests, args.max_tokens, args.warmup))
        return
    with tempfile.TemporaryDirectory() as logs:
        started = time.monotonic()
        with VllmPair(resolve_vllm_python(args.vllm_python), log_dir=Path(logs)) as pair:
            print(f"both servers healthy after {time.monotonic() - started:.0f} s")
            urls = {arm: pair.url(arm) for arm in ("speculative", "baseline")}
            asyncio.run(_measure(urls, args.requests, args.max_tokens, args.warmup))


if __name__ == "__main__":
    main()
