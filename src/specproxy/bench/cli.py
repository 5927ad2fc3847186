"""`specproxy bench`: flags -> `harness.run_bench`, then one table per temperature.

Per block it prints, per arm: n, errors, E2E p50/p99, TTFT and TPOT p50, tokens per event and
acceptance; a P99 only once the arm has the samples its distribution-free 95% CI needs (368),
else how many it lacks. Then the speedups (baseline / speculative) of E2E and TPOT, median and
P99, each with its bootstrap CI from the stats module (`bench.summary.speedups`); throughput per
arm and overall (requests/s, output tokens/s, total tokens/s, as `vllm bench serve` prints
them, over the block's wall time); and the harness's own overhead.

After the blocks it prints the calibration advice (`bench.calibration`): the best setting by
E2E median speedup with its CI, whether the runner-up is distinguishable, or "do not enable".
A k sweep is one bench run per speculative configuration (`--k`, or read from the engine), each
with `--json`; `specproxy calibrate A.json B.json ..` then advises over all of them.

`--json FILE` writes {"blocks": [...], "calibration": [...]}: one object per block
(temperature x load level),

    run_id: str                    the block's run id in the store
    temperature: float
    k: int | null                  the speculative arm's num_speculative_tokens (--k, else the
                                   number of per-position acceptance counters it exports)
    concurrency: int | null        closed-loop clients of the block (null when open loop)
    rate: float | null             open-loop arrivals per second (null when closed loop)
    wall_s: float                  the block's wall-clock time
    arms: [                        one per arm, speculative first ("proxy" through --proxy)
      {arm, n, errors, e2e_p50_s, e2e_p99_s, ttft_p50_s, tpot_p50_s, tokens_per_event,
       acceptance_rate,            what the table shows: the engine's counter deltas over the
       acceptance_source,          block ("engine") when scraped, else the mean per-request
                                   rate vLLM reported ("requests"), else null (no speculation)
       mean_acceptance_length, prompt_tokens, output_tokens,
       throughput: {requests_per_s, output_tokens_per_s, total_tokens_per_s}}
    ]
    throughput: {requests_per_s, output_tokens_per_s, total_tokens_per_s}   all arms together
    speedups: {e2e|tpot: {median|p99: {status: "ok", estimate, lower, upper}
                                      | {status: "insufficient", n_needed: {arm: int}}}}
    engine_acceptance: {arm: float | null}
    overhead: {parse_p50_s, parse_p99_s, lateness_p50_s, lateness_p99_s, e2e_p50_s} | null

and one calibration object per load level (`calibration.Advice.to_dict`):

    load: str | null; decision: "enable" | "do_not_enable" | "inconclusive" | "no_data"
    message: str; best, runner_up: {run_id, temperature, k, estimate, lower, upper} | null
    distinguishable: bool | null; ties, ranked: [setting]; insufficient: [{.., n_needed}]
    by_temperature: [the same object at each temperature alone]  (when k and T both vary)

Times are seconds, rates per second. `--rate-sweep` / `--concurrency-sweep` run one block per
load level and end with the E2E median speedup against load; `--max-seconds` bounds each block.
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

from specproxy.bench.calibration import Advice, advise_sweep
from specproxy.bench.harness import BlockResult, run_bench
from specproxy.bench.summary import CONFIDENCE, ArmSummary, HarnessOverhead
from specproxy.errors import ConfigError
from specproxy.loadgen import Target
from specproxy.records import SHORTHAND_ARMS, SHORTHAND_CONTROL, Arm
from specproxy.stats.estimate.quantile import samples_needed

__all__ = ["DEFAULT_STORE", "advice_lines", "configure", "run"]

DEFAULT_STORE = "sqlite:///specproxy.db"


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("what to drive (one of)")
    where.add_argument("--url", help="one OpenAI-compatible endpoint (label it with --arm)")
    where.add_argument("--speculative", metavar="URL", help="speculative arm, driven directly")
    where.add_argument("--baseline", metavar="URL", help="baseline arm, driven directly")
    where.add_argument("--proxy", metavar="URL", help="the specproxy proxy (it records itself)")
    parser.add_argument("--arm", choices=SHORTHAND_ARMS, default=SHORTHAND_CONTROL)
    parser.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    parser.add_argument("--prompts", help="JSONL prompts: plain, chat messages or ShareGPT")
    data = parser.add_argument_group("synthetic dataset (instead of --prompts)")
    data.add_argument(
        "--dataset",
        choices=["prompts", "random"],
        default="prompts",
        help="random: synthetic prompts of --input-len / --output-len tokens",
    )
    data.add_argument("--input-len", type=int, default=128, help="prompt tokens (random)")
    data.add_argument("--output-len", type=int, default=128, help="output tokens (random)")
    data.add_argument(
        "--range-ratio",
        type=float,
        default=0.0,
        help="lengths uniform in len x [1 - r, 1 + r]; 0: fixed (random)",
    )
    data.add_argument("--num-prompts", type=int, default=1000, help="distinct prompts (random)")
    data.add_argument(
        "--ignore-eos",
        action="store_true",
        help="ask vLLM to generate exactly max_tokens (fixed output lengths)",
    )
    parser.add_argument("--requests", type=int, default=1000, help="measured requests per block")
    load = parser.add_mutually_exclusive_group()
    load.add_argument("--concurrency", type=int, default=8, help="closed-loop clients")
    load.add_argument("--rate", type=float, help="open-loop Poisson arrivals per second")
    sweep = parser.add_mutually_exclusive_group()
    sweep.add_argument(
        "--rate-sweep",
        metavar="R1,R2,..",
        help="one open-loop block per arrival rate: speedup against load",
    )
    sweep.add_argument(
        "--concurrency-sweep", metavar="C1,C2,..", help="one closed-loop block per client count"
    )
    parser.add_argument(
        "--max-seconds", type=float, help="end each block after this long (or --requests)"
    )
    parser.add_argument(
        "--warmup",
        default="auto",
        help="'auto' (until latency per token stabilises), or a fixed count (0: none)",
    )
    parser.add_argument("--temperatures", default="0", help="comma-separated sweep, e.g. 0,0.5,1")
    parser.add_argument(
        "--k",
        type=int,
        help="the speculative arm's num_speculative_tokens, for the calibration advice "
        "(default: read from its /metrics when driven directly)",
    )
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
    loads = _loads(args)
    prompt_set = None
    if getattr(args, "dataset", "prompts") == "random":
        from specproxy.prompts.synthetic import synthetic_prompts

        prompt_set = synthetic_prompts(
            args.num_prompts,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            seed=args.seed,
        )
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise ConfigError("--max-seconds must be > 0")
    if args.requests < 1:
        raise ConfigError("--requests must be >= 1")
    if args.rate is not None and args.rate <= 0:
        raise ConfigError("--rate must be > 0")
    if args.rate is None and args.concurrency < 1:
        raise ConfigError("--concurrency must be >= 1")
    k = getattr(args, "k", None)
    if k is not None and k < 1:
        raise ConfigError("--k must be >= 1")
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
            loads=loads,
            max_seconds=args.max_seconds,
            prompt_set=prompt_set,
            ignore_eos=getattr(args, "ignore_eos", False),
            k=k,
        )
    )
    for block in blocks:
        console.print(_block_table(block))
        for line in (*_speedup_lines(block), *_throughput_lines(block)):
            console.print(line, highlight=False)
        console.print(_overhead_line(block.overhead, open_loop=args.rate is not None))
    if len(blocks) > 1:
        for line in _sweep_lines(blocks):
            console.print(line, highlight=False)
    data = [_jsonable(b) for b in blocks]
    advice = advise_sweep(data)
    if any(b.speedups for b in blocks):  # nothing to advise on from one arm
        for line in advice_lines(advice):
            console.print(line, highlight=False)
    if args.proxy is None:
        console.print(
            f"rows written to {args.store} (run ids: {', '.join(b.run_id for b in blocks)})"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"blocks": data, "calibration": [a.to_dict() for a in advice]}, fh, indent=2)
    return 0


def advice_lines(advice: list[Advice]) -> list[str]:
    """The calibration advice in words: one line per load level, then its ranking."""
    lines = []
    for a in advice:
        where = f" at {a.load}" if a.load is not None and len(advice) > 1 else ""
        lines.append(f"calibration{where}: {a.message}")
        if len(a.ranked) > 1:
            lines.append(
                "  ranked (E2E median speedup, 95% CI): " + "; ".join(c.text() for c in a.ranked)
            )
        for at in a.by_temperature:
            t = at.best.temperature if at.best else at.insufficient[0].temperature
            lines.append(f"  at T={t:g}: {at.message}")
    return lines


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
    return [Target(args.speculative, "speculative"), Target(args.baseline, "baseline")]


def _loads(args: argparse.Namespace) -> list[tuple[int, float | None]] | None:
    """The load levels of a sweep, or None for the single --concurrency / --rate level."""
    text = getattr(args, "rate_sweep", None) or getattr(args, "concurrency_sweep", None)
    if not text:
        return None
    flag = "--rate-sweep" if getattr(args, "rate_sweep", None) else "--concurrency-sweep"
    try:
        values = [float(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"{flag} must be numbers separated by commas: {text!r}") from exc
    if not values or any(v <= 0 for v in values):
        raise ConfigError(f"{flag} values must be > 0")
    if flag == "--rate-sweep":
        return [(args.concurrency, v) for v in values]
    if any(v != int(v) for v in values):
        raise ConfigError("--concurrency-sweep values must be whole numbers")
    return [(int(v), None) for v in values]


def _sweep_lines(blocks: list[BlockResult]) -> list[str]:
    """Speedup against load: one line per block, the E2E median speedup with its CI."""
    lines = ["speedup against load (E2E median, baseline / speculative, 95% CI):"]
    for block in blocks:
        load = f"{block.rate:g} req/s" if block.rate is not None else f"{block.concurrency} clients"
        ci = block.speedups.get("e2e", {}).get("median")
        if ci is None:
            text = "-"
        elif ci["status"] == "ok":
            text = f"{ci['estimate']:.2f}x [{ci['lower']:.2f}, {ci['upper']:.2f}]"
        else:
            text = f"needs {max(ci['n_needed'].values())} more per arm"
        lines.append(f"  T={block.temperature:g}, {load}: {text}")
    return lines


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


def _acceptance(block: BlockResult, summary: ArmSummary) -> tuple[float | None, str | None]:
    """The acceptance shown for an arm, and where it came from (JSON: the same value)."""
    name = summary.arm if summary.arm is not None else "proxy"
    engine = block.engine_acceptance.get(name)
    if engine is not None:
        return engine, "engine"
    if summary.acceptance_rate is not None:
        return summary.acceptance_rate, "requests"
    return None, None


def _throughput(requests: int, prompt: int, output: int, wall_s: float) -> dict[str, float]:
    wall = wall_s if wall_s > 0 else float("nan")
    return {
        "requests_per_s": requests / wall,
        "output_tokens_per_s": output / wall,
        "total_tokens_per_s": (prompt + output) / wall,
    }


def _p99_cell(summary: ArmSummary) -> str:
    missing = samples_needed("p99", summary.n, CONFIDENCE)
    return _ms(summary.e2e_p99_s) if missing == 0 else f"needs {missing} more"


def _block_table(block: BlockResult) -> Table:
    table = Table(title=f"run {block.run_id}: temperature {block.temperature:g}")
    for column in ("arm", "n", "err", "E2E p50", "E2E p99", "TTFT p50", "TPOT p50", "tok/event"):
        table.add_column(column, justify="right")
    table.add_column("acceptance", justify="right")
    for s in block.arms:
        name = s.arm if s.arm is not None else "proxy"
        acceptance, _ = _acceptance(block, s)
        table.add_row(
            name,
            str(s.n),
            str(s.errors),
            _ms(s.e2e_p50_s),
            _p99_cell(s),
            _ms(s.ttft_p50_s),
            _ms(s.tpot_p50_s),
            f"{s.tokens_per_event:.2f}" if s.tokens_per_event is not None else "-",
            f"{acceptance:.1%}" if acceptance is not None else "-",
        )
    return table


def _speedup_lines(block: BlockResult) -> list[str]:
    """One line per metric: median and P99 speedups with their 95% CIs, or what they lack."""
    lines = []
    for metric, label in (("e2e", "E2E"), ("tpot", "TPOT")):
        cells = []
        for stat, ci in block.speedups.get(metric, {}).items():
            if ci["status"] == "ok":
                cells.append(f"{stat} {ci['estimate']:.2f}x [{ci['lower']:.2f}, {ci['upper']:.2f}]")
            else:
                cells.append(f"{stat}: needs {max(ci['n_needed'].values())} more per arm")
        if cells:
            lines.append(f"{label} speedup (baseline / speculative, 95% CI): " + "; ".join(cells))
    return lines


def _throughput_lines(block: BlockResult) -> list[str]:
    lines = []
    for s in block.arms:
        t = _throughput(s.n, s.prompt_tokens, s.output_tokens, block.wall_s)
        name = s.arm if s.arm is not None else "proxy"
        lines.append(_throughput_text(name, t))
    if len(block.arms) > 1:
        lines.append(_throughput_text("all", _block_throughput(block)))
    return lines


def _block_throughput(block: BlockResult) -> dict[str, float]:
    return _throughput(
        sum(s.n for s in block.arms),
        sum(s.prompt_tokens for s in block.arms),
        sum(s.output_tokens for s in block.arms),
        block.wall_s,
    )


def _throughput_text(name: str, t: dict[str, float]) -> str:
    return (
        f"throughput {name}: {t['requests_per_s']:.2f} req/s, "
        f"{t['output_tokens_per_s']:.1f} output tok/s, {t['total_tokens_per_s']:.1f} total tok/s"
    )


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
    """The documented --json object of one block (schema in the module docstring)."""
    data = asdict(block)
    for arm, summary in zip(data["arms"], block.arms, strict=True):
        arm["arm"] = summary.arm if summary.arm is not None else "proxy"
        arm["acceptance_rate"], arm["acceptance_source"] = _acceptance(block, summary)
        arm["throughput"] = _throughput(
            summary.n, summary.prompt_tokens, summary.output_tokens, block.wall_s
        )
    data["throughput"] = _block_throughput(block)
    return data
