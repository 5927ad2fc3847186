"""The offline harness behind `specproxy bench`: a controlled comparison without live traffic.

It drives one endpoint (`--url`), two arms directly (`--speculative` + `--baseline`, balanced:
each prompt goes to both arms in turn, `loadgen.LoadGenerator`; no proxy in between), or the
proxy (`--proxy`). Warm-up requests are sent first and
never recorded; then `--requests` requests per temperature, closed loop (`--concurrency`) or open
loop (`--rate`). Direct runs write the same `RequestRecord` rows as the proxy into the store, so
`specproxy stats` and `specproxy report` apply unchanged; through the proxy, the proxy records.
A temperature sweep gives each temperature its own run id (`<run-id>-t<temperature>`).
Each block carries the speculative arm's k (num_speculative_tokens): as given (`--k`), else the
number of per-position acceptance counters its /metrics exports, so that blocks of several runs
(one per speculative configuration) form a (k, temperature) sweep for `bench.calibration`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specproxy.bench.summary import (
    ArmSummary,
    HarnessOverhead,
    harness_overhead,
    speedups,
    summarise,
)
from specproxy.bench.warmup import is_stable, per_token_latency
from specproxy.config import StoreConfig
from specproxy.errors import ConfigError, ScrapeError
from specproxy.loadgen import ClientResult, LoadGenerator, RequestOptions, Target
from specproxy.prompts import Prompt, load_prompts
from specproxy.records import Arm, EngineSample
from specproxy.store.contract import Lifecycle, Sink

__all__ = ["BenchSink", "BlockResult", "run_bench", "speculative_k"]


class BenchSink(Sink, Lifecycle, Protocol):
    """What a bench run records its blocks' rows through."""


_WARMUP_WINDOW = 10
_WARMUP_MAX = 200


@dataclass(frozen=True, slots=True)
class BlockResult:
    """One temperature's measured block."""

    run_id: str
    temperature: float
    arms: list[ArmSummary]
    overhead: HarnessOverhead | None
    engine_acceptance: dict[str, float | None]  # arm -> acceptance from /metrics deltas
    wall_s: float
    # metric -> statistic -> CI or insufficient (`summary.speedups`); empty with one arm
    speedups: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    concurrency: int | None = None  # the block's load: closed-loop clients, or
    rate: float | None = None  # open-loop arrivals per second
    k: int | None = None  # the speculative arm's num_speculative_tokens; None: unknown


async def run_bench(
    targets: Sequence[Target],
    *,
    prompts_path: str | None,
    model: str | None,
    requests: int,
    concurrency: int,
    rate: float | None,
    warmup: int | None,
    temperatures: Sequence[float],
    endpoint: Any,
    stream: bool,
    max_tokens: int | None,
    store_url: str | None,
    run_id: str,
    seed: int,
    console: Console,
    loads: Sequence[tuple[int, float | None]] | None = None,
    max_seconds: float | None = None,
    prompt_set: Sequence[Prompt] | None = None,
    ignore_eos: bool = False,
    k: int | None = None,
) -> list[BlockResult]:
    """Warm up, then one measured block per temperature and load; rows go to `store_url`.

    `loads` is a sweep of (concurrency, rate) levels (default: the one given), each block
    bounded by `requests` and, if given, `max_seconds`. With several temperatures or loads each
    block gets its own run id: `<run-id>-t<temperature>` and `-c<clients>` / `-r<rate>`.
    """
    levels = list(loads) if loads else [(concurrency, rate)]
    prompts = list(prompt_set) if prompt_set is not None else load_prompts(prompts_path)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)
    store: BenchSink | None = None
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        model = model or await _first_model(session, targets[0].base_url)
        if store_url is not None:
            store = await _open_store(store_url)
        try:
            base = RequestOptions(
                model=model, endpoint=endpoint, stream=stream, ignore_eos=ignore_eos
            )
            if max_tokens is not None:
                base = _with(base, max_tokens_cap=max_tokens)
            await _warm_up(
                session, targets, prompts, base, warmup, concurrency, rate, seed, console
            )
            blocks = []
            grid = [(t, load) for t in temperatures for load in levels]
            for i, (temperature, (clients, arrivals)) in enumerate(grid):
                block_id = run_id
                if len(temperatures) > 1:
                    block_id += f"-t{temperature:g}"
                if len(levels) > 1:
                    block_id += f"-r{arrivals:g}" if arrivals is not None else f"-c{clients}"
                options = _with(base, temperature=temperature)
                gen = LoadGenerator(session, targets, prompts, options, seed=seed + 1 + i)
                before = await _scrape_all(session, targets)
                t0 = time.perf_counter()
                results = await _measured(
                    gen, requests, clients, arrivals, temperature, console, max_seconds
                )
                wall = time.perf_counter() - t0
                after = await _scrape_all(session, targets)
                if store is not None:
                    for r in results:
                        if r.arm is not None:
                            store.record(r.to_record(run_id=block_id, options=options))
                    await store.flush()
                cis = await asyncio.to_thread(speedups, results, seed=seed + i)
                blocks.append(
                    BlockResult(
                        run_id=block_id,
                        temperature=temperature,
                        arms=summarise(results),
                        overhead=harness_overhead(results),
                        engine_acceptance=_engine_acceptance(before, after, block_id),
                        wall_s=wall,
                        speedups=cis,
                        concurrency=clients if arrivals is None else None,
                        rate=arrivals,
                        k=k if k is not None else speculative_k(after),
                    )
                )
            return blocks
        finally:
            if store is not None:
                await store.close()


async def _warm_up(
    session: aiohttp.ClientSession,
    targets: Sequence[Target],
    prompts: Sequence[Any],
    options: RequestOptions,
    warmup: int | None,
    concurrency: int,
    rate: float | None,
    seed: int,
    console: Console,
) -> None:
    """Requests that are never recorded: a fixed count, or windows until latency is stable."""
    if warmup == 0:
        return
    gen = LoadGenerator(session, targets, prompts, options, seed=seed)
    if warmup is not None:
        await _drive(gen, warmup, concurrency, rate)
        console.print(f"warm-up: {warmup} requests sent and excluded")
        return
    series: dict[Arm | None, list[float]] = {}
    sent = 0
    step = _WARMUP_WINDOW * len(targets)
    while sent < _WARMUP_MAX:
        for r in await _drive(gen, step, concurrency, rate):
            if r.ok:
                series.setdefault(r.arm, []).append(
                    per_token_latency(r.e2e_ns / 1e9, r.output_tokens)
                )
        sent += step
        if series and all(is_stable(v, window=_WARMUP_WINDOW) for v in series.values()):
            break
    console.print(f"warm-up: {sent} requests sent and excluded (latency per token stable)")


async def _drive(
    gen: LoadGenerator, count: int, concurrency: int, rate: float | None
) -> list[ClientResult]:
    if rate is not None:
        return await gen.run_open_loop(rate, count=count)
    return await gen.run_closed_loop(concurrency, count=count)


async def _measured(
    gen: LoadGenerator,
    count: int,
    concurrency: int,
    rate: float | None,
    temperature: float,
    console: Console,
    max_seconds: float | None = None,
) -> list[ClientResult]:
    columns = (
        TextColumn(f"temperature {temperature:g}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("requests", total=count)

        def advance(_: ClientResult) -> None:
            progress.advance(task)

        if rate is not None:
            return await gen.run_open_loop(
                rate, count=count, duration_s=max_seconds, on_result=advance
            )
        return await gen.run_closed_loop(
            concurrency, count=count, duration_s=max_seconds, on_result=advance
        )


async def _scrape_all(session: aiohttp.ClientSession, targets: Sequence[Target]) -> dict[Arm, Any]:
    """Each directly driven arm's /metrics, parsed; arms that do not answer are left out."""
    from specproxy.scrape.parse import parse_metrics

    snapshots: dict[Arm, Any] = {}
    for target in targets:
        if target.arm is None:
            continue
        try:
            async with session.get(target.base_url.rstrip("/") + "/metrics") as resp:
                if resp.status != 200:
                    continue
                text = await resp.text()
            snapshots[target.arm] = await asyncio.to_thread(parse_metrics, text, t=time.time())
        except (aiohttp.ClientError, TimeoutError, ScrapeError):
            continue
    return snapshots


def speculative_k(snapshots: dict[Arm, Any]) -> int | None:
    """k as the speculative arm's /metrics shows it: one per-position acceptance counter per
    draft position (V1 engines export them from start-up, zeros included); None when that arm
    was not scraped (driven through the proxy) or exports no per-position counters (V0)."""
    snap = snapshots.get("speculative")
    positions = getattr(snap, "accepted_per_position", None)
    return len(positions) if positions else None


def _engine_acceptance(
    before: dict[Arm, Any], after: dict[Arm, Any], run_id: str
) -> dict[str, float | None]:
    """Acceptance over the block from each arm's counter deltas (what vLLM's bench reports)."""
    from specproxy.scrape.derive import derive_sample

    out: dict[str, float | None] = {}
    for arm, cur in after.items():
        prev = before.get(arm)
        if prev is None:
            continue
        sample: EngineSample = derive_sample(prev, cur, run_id=run_id, arm=arm)
        if sample.acceptance_rate is not None:
            out[arm] = sample.acceptance_rate
    return out


async def _first_model(session: aiohttp.ClientSession, base_url: str) -> str:
    url = base_url.rstrip("/") + "/v1/models"
    try:
        async with session.get(url) as resp:
            body = await resp.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot list models at {url} ({exc}); pass --model") from exc
    try:
        return str(body["data"][0]["id"])
    except (KeyError, IndexError, TypeError) as exc:
        raise ConfigError(f"{url} lists no model; pass --model") from exc


async def _open_store(url: str) -> BenchSink:
    from specproxy.store.factory import open_store

    store: BenchSink = open_store(StoreConfig(url=url))
    await store.start()
    return store


def _with(options: RequestOptions, **changes: Any) -> RequestOptions:
    return replace(options, **changes)
