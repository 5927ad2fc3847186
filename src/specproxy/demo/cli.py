"""`specproxy demo`: flags -> `DemoOptions` -> `runner.run_demo`, then where the report went.

With real vLLM (`--vllm` or `--vllm-python`) the defaults change to a gentler load, since real
CPU servers share two cores. `--overload` (emulators only) forces an overloaded run.
`--arms 3` (emulators only) runs the baseline and two n-gram treatments (`runner.demo_arms`).
"""

from __future__ import annotations

import argparse
import asyncio
import shlex
from pathlib import Path
from urllib.parse import urlsplit

from rich.console import Console

from specproxy.demo.capacity import OVERLOAD_FACTOR
from specproxy.demo.runner import DEMO_ARM_COUNTS, DemoOptions, run_demo
from specproxy.errors import ConfigError
from specproxy.logs import use_console
from specproxy.store.sqlite import sqlite_path

__all__ = ["REAL_MAX_TOKENS", "REAL_RATE", "configure", "options_from_args", "run"]

# Real vLLM CPU servers share two cores: a gentler load keeps them out of saturation.
REAL_RATE = 2.0
REAL_MAX_TOKENS = 128


def configure(parser: argparse.ArgumentParser) -> None:
    d = DemoOptions()
    add = parser.add_argument
    add(
        "--rate",
        type=float,
        help=f"Poisson arrivals per second (default {d.rate:g}; {REAL_RATE:g} with real vLLM)",
    )
    add("--duration", type=float, default=d.duration_s, help="seconds of load before the report")
    add(
        "--acceptance",
        type=float,
        default=d.acceptance,
        help="emulated per-position draft acceptance (alpha)",
    )
    add("--speculative-tokens", type=int, default=d.speculative_tokens, help="emulated k")
    add("--store", default=d.store, help="store URL (sqlite:///..., postgresql://..., memory://)")
    add("--vllm", metavar="URL,URL", help="real servers instead of emulators: speculative,baseline")
    add("--vllm-python", metavar="PATH", help="start real vLLM CPU servers with this python")
    add("--host", default=d.host, help="proxy listen address")
    add("--port", type=int, default=d.port, help="proxy port (busy: a free one is used)")
    add("--out", default=d.out, help="report directory")
    add("--run-id", help="default: demo-<unix time>")
    add("--prompts", help="JSONL prompts (default: the packaged set)")
    add(
        "--max-tokens",
        type=int,
        help=f"cap on each prompt's output budget (default {d.max_tokens} on the emulators, "
        f"{REAL_MAX_TOKENS} on real vLLM; 0: the prompts' own budgets)",
    )
    add(
        "--overload",
        action="store_true",
        help="emulators only: slow both arms' steps until the slower arm gets "
        f"{OVERLOAD_FACTOR:g}x the requests it serves (by the emulator's model), to see what "
        "the diagnosis says of a comparison that measures queueing",
    )
    add(
        "--arms",
        type=int,
        choices=DEMO_ARM_COUNTS,
        default=d.arms,
        help="emulators only: 2 (baseline and speculative, default) or 3 (baseline, n-gram k=2 "
        "at acceptance 0.7 and n-gram k=4 at 0.5, whose true speedups differ; --acceptance and "
        "--speculative-tokens are the two-arm demo's)",
    )
    add("--stats-interval", type=float, default=d.stats_interval_s, help="seconds between stats")
    add("--resamples", type=int, default=d.resamples, help="bootstrap resamples")
    add("--seed", type=int, default=d.seed, help="seed of the prompts and arrivals")


def run(args: argparse.Namespace) -> int:
    opts = options_from_args(args)
    console = Console()
    use_console(console)  # log lines print above the live view instead of breaking its rows
    outcome = asyncio.run(run_demo(opts, console=console))
    if outcome.report_dir is None:
        console.print("no report: nothing was recorded")
        return 1
    console.print(f"report: {outcome.report_dir / 'index.html'}")
    for line in next_steps(outcome.store, outcome.run_id):
        console.print(line, soft_wrap=True, highlight=False)
    return 0


def next_steps(store: str, run_id: str) -> list[str]:
    """Where the demo's records are, and the commands that read them again (paste-ready)."""
    if urlsplit(store).scheme == "memory":
        return [f"store: {store} (gone with the demo; use --store sqlite:///FILE to keep it)"]
    where = store
    if urlsplit(store).scheme == "sqlite":
        where = f"{store} ({Path(sqlite_path(store)[0]).resolve()})"
    quoted_store, quoted_run = shlex.quote(store), shlex.quote(run_id)
    return [
        f"store: {where}, run {run_id}",
        "read it again:",
        f"  specproxy stats --store {quoted_store} --run-id {quoted_run}",
        f"  specproxy report --store {quoted_store} --run-id {quoted_run} --out out/report",
    ]


def options_from_args(args: argparse.Namespace) -> DemoOptions:
    urls: tuple[str, str] | None = None
    if args.vllm:
        parts = [u.strip() for u in args.vllm.split(",") if u.strip()]
        if len(parts) != 2:
            raise ConfigError("--vllm takes two URLs: speculative,baseline")
        urls = (parts[0], parts[1])
    if urls is not None and args.vllm_python:
        raise ConfigError("--vllm and --vllm-python exclude each other")
    real = urls is not None or args.vllm_python is not None
    rate = args.rate if args.rate is not None else (REAL_RATE if real else DemoOptions().rate)
    max_tokens = (
        args.max_tokens
        if args.max_tokens is not None
        else (REAL_MAX_TOKENS if real else DemoOptions().max_tokens)
    )
    if max_tokens is not None and max_tokens < 0:
        raise ConfigError("--max-tokens must be >= 0")
    if real and args.overload:
        raise ConfigError("--overload slows the emulated arms: not with --vllm or --vllm-python")
    if real and args.arms != 2:
        raise ConfigError("--arms 3 runs emulated arms: not with --vllm or --vllm-python")
    if rate <= 0:
        raise ConfigError("--rate must be > 0")
    if args.duration <= 0:
        raise ConfigError("--duration must be > 0")
    if not 0.0 <= args.acceptance <= 1.0:
        raise ConfigError("--acceptance must be in [0, 1]")
    if args.speculative_tokens < 1:
        raise ConfigError("--speculative-tokens must be >= 1")
    return DemoOptions(
        rate=rate,
        duration_s=args.duration,
        acceptance=args.acceptance,
        speculative_tokens=args.speculative_tokens,
        store=args.store,
        vllm_urls=urls,
        vllm_python=args.vllm_python,
        host=args.host,
        port=args.port,
        out=args.out,
        run_id=args.run_id,
        prompts=args.prompts,
        max_tokens=max_tokens or None,
        overload=args.overload,
        arms=args.arms,
        stats_interval_s=args.stats_interval,
        resamples=args.resamples,
        seed=args.seed,
    )
