"""The offline harness behind `specproxy bench`: a controlled comparison without live traffic.

It drives one endpoint (`--url`), n named arms directly (`--arm NAME=URL` with `--control`, or
the two-arm shorthand `--speculative` + `--baseline`; no proxy in between), or the proxy
(`--proxy`). Each direct arm runs its own stream (`loadgen.LoadGenerator`): its own closed-loop
clients (`--max-concurrency` per arm) or its own arrivals (`--request-rate` per arm), with the same
prompts in the same order on every arm. Warm-up requests are sent first and never recorded; then
`--requests` requests per temperature (split evenly over the arms). Each treatment is compared
with the control (`comparisons`; `speedups` is the sole treatment's, with two arms). Direct
runs write the same `RequestRecord` rows as the proxy into the store, so `specproxy stats` and
`specproxy report` apply unchanged; through the proxy, the proxy records.
A temperature sweep gives each temperature its own run id (`<run-id>-t<temperature>`).
Each block carries the (first) treatment's k (num_speculative_tokens): as given (`--k`), else the
number of per-position acceptance counters its /metrics exports, so that blocks of several runs
(one per speculative configuration) form a (k, temperature) sweep for `bench.calibration`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Protocol

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specproxy.bench.result import arm_result
from specproxy.bench.summary import (
    ArmSummary,
    HarnessOverhead,
    harness_overhead,
    speedups,
    summarise,
)
from specproxy.bench.warmup import is_stable, per_token_latency
from specproxy.config import MAX_ARMS, SegmentsConfig, StoreConfig
from specproxy.errors import ConfigError, ScrapeError
from specproxy.loadgen import ClientResult, LoadGenerator, RequestOptions, Target
from specproxy.prompts import Prompt, load_prompts
from specproxy.proxy.conditions import Categories
from specproxy.records import (
    ARM_NAME_PATTERN,
    SHORTHAND_CONTROL,
    SHORTHAND_TREATMENT,
    EngineSample,
)
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
    # metric -> statistic -> CI or insufficient (`summary.speedups`) of the one treatment
    # against the control; empty with one arm or with several treatments (see comparisons)
    speedups: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    concurrency: int | None = None  # the block's load: closed-loop clients per arm, or
    rate: float | None = None  # open-loop arrivals per second per arm
    k: int | None = None  # the (first) treatment's num_speculative_tokens; None: unknown
    control: str | None = None  # the control arm's name (None: one arm, or the proxy)
    comparisons: dict[str, dict[str, dict[str, dict[str, Any]]]] = field(default_factory=dict)
    burstiness: float = 1.0  # open loop: the gamma shape of the arrivals (1: Poisson)
    goodput: dict[str, float] = field(default_factory=dict)  # the SLOs, milliseconds
    model: str | None = None  # the model served
    # arm -> its figures under vLLM's result names (`bench.result.arm_result`)
    vllm: dict[str, dict[str, Any]] = field(default_factory=dict)


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
    burstiness: float = 1.0,
    goodput: dict[str, float] | None = None,
    category_header: str | None = None,
) -> list[BlockResult]:
    """Warm up, then one measured block per temperature and load; rows go to `store_url`.

    `loads` is a sweep of (concurrency, rate) levels (default: the one given), each block
    bounded by `requests` and, if given, `max_seconds`. With several temperatures or loads each
    block gets its own run id: `<run-id>-t<temperature>` and `-c<clients>` / `-r<rate>`.
    `goodput` holds SLOs in milliseconds (`summary.parse_goodput`); `category_header` names the
    header that carries each prompt's dataset category.
    """
    control = _control(targets)
    names = [t.arm for t in targets if t.arm is not None]
    treatments = [n for n in names if n != control] if control is not None else []
    if store_url is not None:
        _check_recordable(names)
    levels = list(loads) if loads else [(concurrency, rate)]
    prompts = list(prompt_set) if prompt_set is not None else load_prompts(prompts_path)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)
    store: BenchSink | None = None
    # the rows' categories, bounded as the proxy bounds its header's (`SegmentsConfig`)
    categories = Categories(SegmentsConfig().categories_max)
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        model = model or await _first_model(session, targets[0].base_url)
        if store_url is not None:
            store = await _open_store(store_url)
        try:
            base = RequestOptions(
                model=model,
                endpoint=endpoint,
                stream=stream,
                ignore_eos=ignore_eos,
                category_header=category_header,
            )
            if max_tokens is not None:
                base = _with(base, max_tokens_cap=max_tokens)
            await _warm_up(
                session,
                targets,
                prompts,
                base,
                warmup,
                concurrency,
                rate,
                seed,
                console,
                burstiness,
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
                gen = LoadGenerator(
                    session, targets, prompts, options, seed=seed + 1 + i, burstiness=burstiness
                )
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
                            store.record(
                                r.to_record(run_id=block_id, options=options, categories=categories)
                            )
                    await store.flush()
                comparisons = {}
                for treatment in treatments:
                    assert control is not None  # treatments exist only beside a control
                    comparisons[treatment] = await asyncio.to_thread(
                        partial(
                            speedups, results, control=control, treatment=treatment, seed=seed + i
                        )
                    )
                slo = {name: ms / 1e3 for name, ms in (goodput or {}).items()}
                by_arm: dict[str, list[ClientResult]] = {}
                for r in results:
                    by_arm.setdefault(r.arm or "proxy", []).append(r)
                blocks.append(
                    BlockResult(
                        run_id=block_id,
                        temperature=temperature,
                        arms=summarise(results, order=names, goodput=slo or None),
                        overhead=harness_overhead(results),
                        engine_acceptance=_engine_acceptance(before, after, block_id),
                        wall_s=wall,
                        speedups=comparisons[treatments[0]] if len(comparisons) == 1 else {},
                        concurrency=clients if arrivals is None else None,
                        rate=arrivals,
                        k=k if k is not None else _first_k(after, treatments),
                        control=control,
                        comparisons=comparisons,
                        burstiness=burstiness,
                        goodput=dict(goodput or {}),
                        model=model,
                        vllm={a: arm_result(rows, goodput or {}) for a, rows in by_arm.items()},
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
    burstiness: float = 1.0,
) -> None:
    """Requests that are never recorded: a fixed count, or windows until latency is stable."""
    if warmup == 0:
        return
    gen = LoadGenerator(session, targets, prompts, options, seed=seed, burstiness=burstiness)
    if warmup is not None:
        await _drive(gen, warmup, concurrency, rate)
        console.print(f"warm-up: {warmup} requests sent and excluded")
        return
    series: dict[str | None, list[float]] = {}
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


async def _scrape_all(session: aiohttp.ClientSession, targets: Sequence[Target]) -> dict[str, Any]:
    """Each directly driven arm's /metrics, parsed; arms that do not answer are left out."""
    from specproxy.scrape.parse import parse_metrics

    snapshots: dict[str, Any] = {}
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


def speculative_k(snapshots: dict[str, Any], arm: str = SHORTHAND_TREATMENT) -> int | None:
    """k as an arm's /metrics shows it: one per-position acceptance counter per draft position
    (V1 engines export them from start-up, zeros included); None when that arm was not scraped
    (driven through the proxy) or exports no per-position counters (V0)."""
    snap = snapshots.get(arm)
    positions = getattr(snap, "accepted_per_position", None)
    return len(positions) if positions else None


def _first_k(snapshots: dict[str, Any], treatments: Sequence[str]) -> int | None:
    return next((k for t in treatments if (k := speculative_k(snapshots, t)) is not None), None)


def _control(targets: Sequence[Target]) -> str | None:
    """The control arm's name: the target marked so, else (two-arm shorthand) the baseline."""
    named = [t for t in targets if t.arm is not None]
    marked = [t.arm for t in named if t.control]
    if len(marked) > 1:
        raise ConfigError(f"exactly one control arm, got {', '.join(map(str, marked))}")
    if marked:
        return marked[0]
    if len(named) < 2:
        return None
    if any(t.arm == SHORTHAND_CONTROL for t in named):
        return SHORTHAND_CONTROL
    raise ConfigError("name the control arm (--control NAME)")


def _check_recordable(names: Sequence[str]) -> None:
    """The store records arms by name: names of records.ARM_NAME_PATTERN, at most MAX_ARMS."""
    bad = [n for n in names if ARM_NAME_PATTERN.fullmatch(n) is None]
    if bad:
        raise ConfigError(
            f"arm names {', '.join(bad)} cannot be recorded: a lower-case letter, then up to 31"
            " of a-z 0-9 _ - (or pass --store none)"
        )
    if len(names) > MAX_ARMS:
        raise ConfigError(f"at most {MAX_ARMS} arms are recorded, got {len(names)}")


def _engine_acceptance(
    before: dict[str, Any], after: dict[str, Any], run_id: str
) -> dict[str, float | None]:
    """Acceptance over the block from each arm's counter deltas (what vLLM's bench reports)."""
    from specproxy.scrape.derive import derive_sample

    out: dict[str, float | None] = {}
    for arm, cur in after.items():
        prev = before.get(arm)
        if prev is None:
            continue
        # Read for its acceptance only, never stored: the label is the arm's name as given.
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
