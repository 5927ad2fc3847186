"""Measured speedup of an emulated pair on the wall clock, beside Leviathan's formula.

    .venv/bin/python benchmarks/bench_emulator.py [--time-scale 0.1] [--requests 32]

Concurrency 1: streamed, client-measured TPOT = (E2E - TTFT) / (tokens - 1); concurrency 64:
non-streamed, TPOT from the emulator's per-request metrics. Medians over requests, so a stall
of a busy machine does not masquerade as physics. Prints figures, asserts nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
import time

import aiohttp

from specproxy.emulator import EmulatorConfig, run_emulator

PROMPT = "Repeat after me: ld ld ld"


async def closed_loop(
    url: str, *, concurrency: int, requests: int, max_tokens: int, stream: bool
) -> tuple[float, float]:
    """(median TPOT, median E2E) in seconds."""
    tpots: list[float] = []
    e2es: list[float] = []
    left = [requests]
    body = {"prompt": PROMPT, "max_tokens": max_tokens, "stream": stream}

    async def client(session: aiohttp.ClientSession) -> None:
        while left[0] > 0:
            left[0] -= 1
            start = time.perf_counter()
            ttft: float | None = None
            async with session.post(url + "/v1/completions", json=body) as resp:
                if stream:
                    async for line in resp.content:
                        if ttft is None and line.startswith(b"data: "):
                            ttft = time.perf_counter() - start
                else:
                    itl_ms = (await resp.json())["metrics"]["mean_itl_ms"]
            e2e = time.perf_counter() - start
            e2es.append(e2e)
            tpots.append((e2e - (ttft or 0.0)) / (max_tokens - 1) if stream else itl_ms / 1000)

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        await asyncio.gather(*(client(session) for _ in range(concurrency)))
    return statistics.median(tpots), statistics.median(e2es)


async def measure(args: argparse.Namespace) -> None:
    spec = EmulatorConfig(
        speculative=True,
        per_request_metrics=True,
        time_scale=args.time_scale,
        warmup_requests=0,
        acceptance_spread=0.0,
    )
    print(f"formula (Leviathan): {spec.physics().expected_speedup():.3f}x")
    for concurrency, stream, max_tokens in ((1, True, 128), (64, False, 32)):
        # 64 sequences cost the emulator ~1 ms of CPU per step: keep modelled steps well above it.
        scale = args.time_scale if concurrency == 1 else max(args.time_scale, 0.5)
        spec = dataclasses.replace(spec, time_scale=scale)
        base = dataclasses.replace(spec, speculative=False)
        results = []
        for cfg in (base, spec):
            async with run_emulator(cfg) as url:
                results.append(
                    await closed_loop(
                        url,
                        concurrency=concurrency,
                        requests=max(args.requests, 2 * concurrency),
                        max_tokens=max_tokens,
                        stream=stream,
                    )
                )
        (b_tpot, b_e2e), (s_tpot, s_e2e) = results
        print(
            f"concurrency {concurrency:>3}: TPOT speedup {b_tpot / s_tpot:.3f}x  "
            f"E2E speedup {b_e2e / s_e2e:.3f}x"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-scale", type=float, default=0.1)
    parser.add_argument("--requests", type=int, default=32)
    asyncio.run(measure(parser.parse_args()))


if __name__ == "__main__":
    main()
