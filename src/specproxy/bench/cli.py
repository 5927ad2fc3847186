"""`specproxy bench`: flags -> `harness.run_bench`, then one table per temperature.

The tables (per arm: n, errors, E2E/TTFT/TPOT, tokens per event, acceptance) and the harness's
own overhead are printed; `--json FILE` writes the same summary for machines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from rich.console import Console
from rich.table import Table

from specproxy.bench.harness import BlockResult, run_bench
from specproxy.bench.summary import HarnessOverhead
from specproxy.errors import ConfigError
from specproxy.loadgen import Target
from specproxy.records import Arm

__all__ = ["DEFAULT_STORE", "configure", "run"]

DEFAULT_STORE = "sqlite:///specproxy.db"


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
