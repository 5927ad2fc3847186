"""`specproxy bench`: the offline harness, for a controlled comparison without live traffic.

It drives one endpoint (`--url`), two arms directly (`--speculative` + `--baseline`, a random
50/50 split, no proxy in between), or the proxy (`--proxy`). Warm-up requests are sent first and
never recorded; then `--requests` requests per temperature, closed loop (`--concurrency`) or open
loop (`--rate`). Direct runs write the same `RequestRecord` rows as the proxy into the store, so
`specproxy stats` and `specproxy report` apply unchanged; through the proxy, the proxy records.
A temperature sweep gives each temperature its own run id (`<run-id>-t<temperature>`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from specproxy.bench.summary import ArmSummary, HarnessOverhead, harness_overhead, summarise
from specproxy.bench.warmup import is_stable, per_token_latency
from specproxy.config import StoreConfig
from specproxy.errors import ConfigError, ScrapeError
from specproxy.loadgen import ClientResult, LoadGenerator, RequestOptions, Target
from specproxy.prompts import load_prompts
from specproxy.records import Arm, EngineSample
from specproxy.store.base import Store

__all__ = ["BlockResult", "configure", "run", "run_bench"]

DEFAULT_STORE = "sqlite:///specproxy.db"
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


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("what to drive (one of)")
    where.add_argument("--url", help="one OpenAI-compatible endpoint (label it with --arm)")
    where.add_argument("--speculative", metavar="URL", help="speculative arm, driven directly")
    where.add_argument("--baseline", metavar="URL", help="baseline arm, driven directly")
    where.add_argument("--proxy", metavar="URL", help="the specproxy proxy (it records itself)")
    parser.add_argument("--arm", choices=[a.value for a in Arm], default=Arm.BASELINE.value)
    parser.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    parser.add_argument("--prompts", help="JSONL prompts: plain, chat messages or ShareGPT")
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per block")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    load.add_argument("--rate", type=float, help="open-loop Poisson arrivals per second")
    parser.add_argument(
        "--warmup",
        default="auto",
        help="'auto' (until latency per token stabilises), or a fixed count (0: none)",
    )
    parser.add_argument("--temperatures", default="0", help="comma-separated sweep, e.g. 0,0.5,1")
    parser.add_argument("--endpoint", choices=["chat", "completions"], default="chat")
    parser.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    parser.add_argument("--max-tokens", type=int, help="cap on each prompt's output budget")
    parser.add_argument("--store", default=DEFAULT_STORE, help="where direct runs write rows")
    parser.add_argument("--run-id", help="default: bench-<unix time>")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON")


def run(args: argparse.Namespace) -> int:
    targets = _targets(args)
    temperatures = _temperatures(args.temperatures)
    warmup = _warmup(args.warmup)
    if args.requests < 1:
        raise ConfigError("--requests must be >= 1")
    if args.rate is not None and args.rate <= 0:
        raise ConfigError("--rate must be > 0")
    if args.rate is None and args.concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    # Without a terminal (CI logs, files) rich assumes 80 columns: too narrow for the tables.
    console = Console() if sys.stdout.isatty() else Console(width=120)
    blocks = asyncio.run(
        run_bench(
            targets,
            prompts_path=args.prompts,
            model=args.model,
            requests=args.requests,
            concurrency=args.concurrency,
            rate=args.rate,
            warmup=warmup,
            temperatures=temperatures,
            endpoint="chat.completions" if args.endpoint == "chat" else "completions",
            stream=not args.no_stream,
            max_tokens=args.max_tokens,
            store_url=None if args.proxy else args.store,
            run_id=args.run_id or f"bench-{int(time.time())}",
            seed=args.seed,
            console=console,
        )
    )
    for block in blocks:
        console.print(_block_table(block))
        console.print(_overhead_line(block.overhead, open_loop=args.rate is not None))
    if args.proxy is None:
        console.print(
            f"rows written to {args.store} (run ids: {', '.join(b.run_id for b in blocks)})"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump([_jsonable(b) for b in blocks], fh, indent=2)
    return 0


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
) -> list[BlockResult]:
    """Warm up, then one measured block per temperature; rows go to `store_url` if given."""
    prompts = load_prompts(prompts_path)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=600)
    connector = aiohttp.TCPConnector(limit=0)
    store: Store | None = None
    async with aiohttp.ClientSession(
        timeout=timeout, connector=connector, cookie_jar=aiohttp.DummyCookieJar()
    ) as session:
        model = model or await _first_model(session, targets[0].base_url)
        if store_url is not None:
            store = await _open_store(store_url)
        try:
            base = RequestOptions(model=model, endpoint=endpoint, stream=stream)
            if max_tokens is not None:
                base = _with(base, max_tokens_cap=max_tokens)
            await _warm_up(
                session, targets, prompts, base, warmup, concurrency, rate, seed, console
            )
            blocks = []
            for i, temperature in enumerate(temperatures):
                block_id = run_id if len(temperatures) == 1 else f"{run_id}-t{temperature:g}"
                options = _with(base, temperature=temperature)
                gen = LoadGenerator(session, targets, prompts, options, seed=seed + 1 + i)
                before = await _scrape_all(session, targets)
                t0 = time.perf_counter()
                results = await _measured(gen, requests, concurrency, rate, temperature, console)
                wall = time.perf_counter() - t0
                after = await _scrape_all(session, targets)
                if store is not None:
                    for r in results:
                        if r.arm is not None:
                            store.record(r.to_record(run_id=block_id, options=options))
                    await store.flush()
                blocks.append(
                    BlockResult(
                        run_id=block_id,
                        temperature=temperature,
                        arms=summarise(results),
                        overhead=harness_overhead(results),
                        engine_acceptance=_engine_acceptance(before, after, block_id),
                        wall_s=wall,
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
            return await gen.run_open_loop(rate, count=count, on_result=advance)
        return await gen.run_closed_loop(concurrency, count=count, on_result=advance)


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
            out[arm.value] = sample.acceptance_rate
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


async def _open_store(url: str) -> Store:
    from specproxy.store import open_store

    store: Store = open_store(StoreConfig(url=url))
    await store.start()
    return store


def _targets(args: argparse.Namespace) -> list[Target]:
    direct = (args.speculative, args.baseline)
    modes = sum(x is not None for x in (args.url, args.proxy)) + (any(direct) and 1)
    if modes != 1:
        raise ConfigError("give exactly one of --url, --proxy, or --speculative with --baseline")
    if args.url:
        return [Target(args.url, Arm(args.arm))]
    if args.proxy:
        return [Target(args.proxy, None)]
    if not all(direct):
        raise ConfigError("--speculative and --baseline go together")
    return [Target(args.speculative, Arm.SPECULATIVE), Target(args.baseline, Arm.BASELINE)]


def _temperatures(text: str) -> list[float]:
    try:
        values = [float(t) for t in text.split(",") if t.strip()]
    except ValueError as exc:
        raise ConfigError(f"--temperatures must be numbers separated by commas: {text!r}") from exc
    if not values or any(not 0.0 <= t <= 2.0 for t in values):
        raise ConfigError("--temperatures must hold values in [0, 2]")
    return values


def _warmup(text: str) -> int | None:
    if text == "auto":
        return None
    if text.isdigit():
        return int(text)
    raise ConfigError(f"--warmup must be 'auto' or a count, got {text!r}")


def _with(options: RequestOptions, **changes: Any) -> RequestOptions:
    return replace(options, **changes)


def _block_table(block: BlockResult) -> Table:
    table = Table(title=f"run {block.run_id}: temperature {block.temperature:g}")
    for column in ("arm", "n", "err", "E2E p50", "E2E p99", "TTFT p50", "TPOT p50", "tok/event"):
        table.add_column(column, justify="right")
    table.add_column("acceptance", justify="right")
    for s in block.arms:
        name = s.arm.value if s.arm is not None else "proxy"
        engine = block.engine_acceptance.get(name)
        acceptance = engine if engine is not None else s.acceptance_rate
        table.add_row(
            name,
            str(s.n),
            str(s.errors),
            _ms(s.e2e_p50_s),
            _ms(s.e2e_p99_s),
            _ms(s.ttft_p50_s),
            _ms(s.tpot_p50_s),
            f"{s.tokens_per_event:.2f}" if s.tokens_per_event is not None else "-",
            f"{acceptance:.1%}" if acceptance is not None else "-",
        )
    by_arm = {s.arm: s for s in block.arms}
    spec, base = by_arm.get(Arm.SPECULATIVE), by_arm.get(Arm.BASELINE)
    if spec and base and spec.e2e_p50_s and base.e2e_p50_s:
        table.caption = (
            f"median E2E speedup (baseline / speculative): {base.e2e_p50_s / spec.e2e_p50_s:.2f}x"
        )
    return table


def _overhead_line(overhead: HarnessOverhead | None, *, open_loop: bool) -> str:
    if overhead is None:
        return "harness overhead: no successful request"
    line = (
        f"harness overhead: parse p50 {overhead.parse_p50_s * 1e6:.0f} µs "
        f"(p99 {overhead.parse_p99_s * 1e6:.0f} µs) = {overhead.parse_share:.2%} of median E2E"
    )
    if open_loop:  # closed-loop clients have no schedule to be late for
        line += (
            f"; send lateness vs the Poisson schedule p50 {overhead.lateness_p50_s * 1e3:.2f} ms,"
            f" p99 {overhead.lateness_p99_s * 1e3:.2f} ms"
        )
    return line


def _ms(seconds: float | None) -> str:
    return f"{seconds * 1e3:.1f} ms" if seconds is not None else "-"


def _jsonable(block: BlockResult) -> dict[str, Any]:
    data = asdict(block)
    for arm in data["arms"]:
        arm["arm"] = arm["arm"].value if arm["arm"] is not None else None
    return data
