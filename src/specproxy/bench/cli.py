"""`specproxy bench`: flags -> `harness.run_bench`, then one table per temperature.

Arms: `--arm NAME=URL` repeated (n >= 2) with `--control NAME`, or the two-arm shorthand
`--speculative URL --baseline URL` (the baseline is the control). Each arm runs its own stream,
like `vllm bench serve` against it alone: `--max-concurrency` clients per arm (closed loop), or
`--request-rate` arrivals per arm (open loop; `--burstiness`: gamma arrivals, vLLM's meaning).
`--dataset specbench` (or a JSONL file with `category` fields) sends each prompt's category in
`--category-header` (x-specproxy-category) and the summary counts requests per category.

Per block it prints, per arm: n, errors, E2E p50/p99, TTFT and TPOT p50, tokens per event and
acceptance; a P99 only once the arm has the samples its distribution-free 95% CI needs (368),
else how many it lacks. Then, per treatment, the speedups (control / treatment) of E2E and
TPOT, median and P99, each with its bootstrap CI from the stats module (`bench.summary.speedups`);
throughput per arm over its own duration and overall over the block's wall time (requests/s,
output tokens/s, total tokens/s, as `vllm bench serve` prints them), goodput with `--goodput`,
requests per category; and the harness's own overhead. `--save-result` writes each arm's
figures under vLLM's result-JSON names (`bench.result`).

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
    concurrency: int | null        closed-loop clients per arm (null when open loop)
    rate: float | null             open-loop arrivals per second per arm (null when closed loop)
    burstiness: float              the arrivals' gamma shape (1: Poisson)
    wall_s: float                  the block's wall-clock time
    control: str | null            the control arm's name
    goodput: {ttft|tpot|e2el: ms}  the SLOs given
    arms: [                        one per arm in the order given ("proxy" through --proxy)
      {arm, n, errors, e2e_p50_s, e2e_p99_s, ttft_p50_s, tpot_p50_s, tokens_per_event,
       acceptance_rate,            what the table shows: the engine's counter deltas over the
       acceptance_source,          block ("engine") when scraped, else the mean per-request
                                   rate vLLM reported ("requests"), else null (no speculation)
       mean_acceptance_length, prompt_tokens, output_tokens,
       duration_s,                 the arm's first send to its last byte
       good: int | null,           requests within every --goodput SLO
       categories: {category: n},  successful requests per dataset category
       throughput: {requests_per_s, output_tokens_per_s, total_tokens_per_s}}  over duration_s
    ]
    comparisons: {treatment: the speedups object below, against the control}
    vllm: {arm: vLLM's result fields (`bench.result.arm_result`)}
    throughput: {requests_per_s, output_tokens_per_s, total_tokens_per_s}   all arms together
    speedups: {e2e|tpot: {median|p99: {status: "ok", estimate, lower, upper}
                                      | {status: "insufficient", n_needed: {arm: int}}}}
                                   the sole treatment's; {} with one arm or several treatments
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from specproxy.bench.calibration import Advice, advise_sweep
from specproxy.bench.harness import BlockResult, run_bench
from specproxy.bench.result import result_filename, setup_fields
from specproxy.bench.summary import CONFIDENCE, ArmSummary, HarnessOverhead, parse_goodput
from specproxy.errors import ConfigError
from specproxy.loadgen import CATEGORY_HEADER, Target
from specproxy.prompts import Prompt, load_prompts, specbench_prompts
from specproxy.records import ARM_NAME_PATTERN, SHORTHAND_CONTROL, SHORTHAND_TREATMENT
from specproxy.stats.estimate.quantile import samples_needed

__all__ = ["DATASETS", "DEFAULT_STORE", "advice_lines", "configure", "run"]

DEFAULT_STORE = "sqlite:///specproxy.db"
DATASETS = ("prompts", "random", "specbench")  # --dataset names; anything else is a file


def configure(parser: argparse.ArgumentParser) -> None:
    where = parser.add_argument_group("what to drive (one of)")
    where.add_argument("--url", help="one OpenAI-compatible endpoint (label it with --arm NAME)")
    where.add_argument(
        "--arm",
        action="append",
        metavar="NAME=URL",
        help="an arm driven directly, repeated for n arms (with --control); "
        "with --url: NAME labels that endpoint (default baseline)",
    )
    where.add_argument("--speculative", metavar="URL", help="speculative arm, driven directly")
    where.add_argument("--baseline", metavar="URL", help="baseline arm (the control), directly")
    where.add_argument("--proxy", metavar="URL", help="the specproxy proxy (it records itself)")
    parser.add_argument(
        "--control", metavar="NAME", help="the --arm every other arm is compared with"
    )
    parser.add_argument("--model", help="model name (default: the first of GET /v1/models)")
    parser.add_argument("--prompts", help="JSONL prompts: plain, chat messages or ShareGPT")
    data = parser.add_argument_group("dataset (instead of --prompts)")
    data.add_argument(
        "--dataset",
        default="prompts",
        metavar="NAME|FILE",
        help=f"{', '.join(DATASETS)}, or a JSONL file (its rows may carry a category); "
        "specbench: the built-in categorized set; random: synthetic prompts of --input-len / "
        "--output-len tokens (default: prompts, the packaged default set or --prompts)",
    )
    data.add_argument(
        "--category-header",
        default=CATEGORY_HEADER,
        help="header that carries each prompt's category to the server (default: %(default)s)",
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
    load.add_argument(
        "--max-concurrency",
        "--concurrency",
        dest="concurrency",
        type=int,
        default=8,
        help="closed-loop clients per arm, each arm its own pool (default: %(default)s)",
    )
    load.add_argument(
        "--request-rate",
        "--rate",
        dest="rate",
        type=float,
        help="open-loop arrivals per second per arm (default: closed loop)",
    )
    parser.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="open loop: gamma arrivals of this shape, mean gap 1/rate (vLLM's meaning); "
        "1: Poisson, < 1 burstier, > 1 more regular (default: %(default)s)",
    )
    parser.add_argument(
        "--goodput",
        nargs="+",
        metavar="KEY:MS",
        help="SLOs for goodput as vLLM takes them, e.g. ttft:500 tpot:50 e2el:5000 "
        "(or comma-separated); a request is good when it meets all of them",
    )
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
    parser.add_argument(
        "--endpoint",
        choices=["chat", "completions"],
        default="chat",
        help="/v1/chat/completions or /v1/completions",
    )
    parser.add_argument("--no-stream", action="store_true", help="non-streaming requests")
    parser.add_argument("--max-tokens", type=int, help="cap on each prompt's output budget")
    parser.add_argument(
        "--store", default=DEFAULT_STORE, help="where direct runs write rows ('none': nowhere)"
    )
    parser.add_argument("--run-id", help="default: bench-<unix time>")
    parser.add_argument("--seed", type=int, default=0, help="seed of the prompts and arrivals")
    parser.add_argument("--json", metavar="FILE", help="also write the summary as JSON")
    saved = parser.add_argument_group("vLLM result JSON (`vllm bench serve --save-result`)")
    saved.add_argument(
        "--save-result", action="store_true", help="write each arm's figures as vLLM names them"
    )
    saved.add_argument("--result-dir", help="directory of the result file (default: .)")
    saved.add_argument(
        "--result-filename",
        help="default: specproxy-bench-{rate}qps[-concurrency{N}]-{model}-{date}.json",
    )


def run(args: argparse.Namespace) -> int:
    targets = _targets(args)
    temperatures = _temperatures(args.temperatures)
    warmup = _warmup(args.warmup)
    loads = _loads(args)
    prompt_set = _prompt_set(args)
    goodput = parse_goodput(args.goodput) if getattr(args, "goodput", None) else {}
    burstiness = getattr(args, "burstiness", 1.0)
    if not burstiness > 0:
        raise ConfigError("--burstiness must be > 0")
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
            store_url=None if args.proxy or args.store == "none" else args.store,
            run_id=args.run_id or f"bench-{int(time.time())}",
            seed=args.seed,
            console=console,
            loads=loads,
            max_seconds=args.max_seconds,
            prompt_set=prompt_set,
            ignore_eos=getattr(args, "ignore_eos", False),
            k=k,
            burstiness=burstiness,
            goodput=goodput,
            category_header=getattr(args, "category_header", CATEGORY_HEADER) or None,
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
    if args.proxy is None and args.store != "none":
        console.print(
            f"rows written to {args.store} (run ids: {', '.join(b.run_id for b in blocks)})"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"blocks": data, "calibration": [a.to_dict() for a in advice]}, fh, indent=2)
    if getattr(args, "save_result", False):
        path = _save_result(args, blocks, burstiness)
        console.print(f"result written to {path}", highlight=False)
    return 0


def _prompt_set(args: argparse.Namespace) -> list[Prompt] | None:
    """The dataset by name (`DATASETS`) or as a JSONL file; None: --prompts or the default."""
    name = getattr(args, "dataset", "prompts")
    if name == "prompts":
        return None
    if name == "random":
        from specproxy.prompts.synthetic import synthetic_prompts

        return synthetic_prompts(
            args.num_prompts,
            input_len=args.input_len,
            output_len=args.output_len,
            range_ratio=args.range_ratio,
            seed=args.seed,
        )
    if name == "specbench":
        return specbench_prompts()
    if args.prompts:
        raise ConfigError("give --dataset FILE or --prompts FILE, not both")
    if not Path(name).is_file():
        raise ConfigError(
            f"--dataset {name!r} is neither a dataset name ({', '.join(DATASETS)}) nor a file"
        )
    return load_prompts(name)


def _save_result(args: argparse.Namespace, blocks: list[BlockResult], burstiness: float) -> Path:
    """`--save-result`: the run's setup and each block's per-arm figures, by vLLM's names."""
    now = datetime.now(UTC)
    date = now.strftime("%Y%m%d-%H%M%S")
    model = args.model or _served_model(blocks)
    doc = setup_fields(
        date=date,
        endpoint="chat.completions" if args.endpoint == "chat" else "completions",
        model=model,
        num_prompts=args.requests,
        rate=args.rate,
        burstiness=burstiness,
        concurrency=args.concurrency if args.rate is None else None,
    )
    doc["goodput"] = blocks[0].goodput if blocks else {}
    doc["control"] = blocks[0].control if blocks else None
    doc["blocks"] = [
        {
            "run_id": b.run_id,
            "temperature": b.temperature,
            "max_concurrency": b.concurrency,
            "request_rate": b.rate if b.rate is not None else "inf",
            "arms": b.vllm,
            "comparisons": b.comparisons,
        }
        for b in blocks
    ]
    name = args.result_filename or result_filename(
        model=model, date=date, rate=args.rate, concurrency=doc["max_concurrency"]
    )
    path = Path(args.result_dir or ".") / name
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot write the result to {path}: {exc.strerror}") from exc
    return path


def _served_model(blocks: list[BlockResult]) -> str:
    return blocks[0].model if blocks and blocks[0].model else "unknown"


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
    """What to drive: one endpoint, the proxy, or named arms (`--arm NAME=URL` / shorthand)."""
    direct = (args.speculative, args.baseline)
    arm = getattr(args, "arm", None)
    given = [arm] if isinstance(arm, str) else list(arm or [])
    pairs = [a for a in given if "=" in a]
    labels = [a for a in given if "=" not in a]
    modes = sum(x is not None for x in (args.url, args.proxy)) + bool(any(direct) or pairs)
    if modes != 1 or (any(direct) and pairs):
        raise ConfigError(
            "give exactly one of --url, --proxy, --arm NAME=URL (repeated), "
            "or --speculative with --baseline"
        )
    control = getattr(args, "control", None)
    if args.url:
        if pairs or len(labels) > 1:
            raise ConfigError("--url takes one label: --arm NAME")
        return [Target(args.url, labels[0] if labels else SHORTHAND_CONTROL)]
    if labels:
        raise ConfigError(f"--arm {labels[0]!r}: give NAME=URL (a bare NAME labels --url)")
    if args.proxy:
        return [Target(args.proxy, None)]
    if pairs:
        return _named_arms(pairs, control)
    if not all(direct):
        raise ConfigError("--speculative and --baseline go together")
    if control is not None and control not in (SHORTHAND_TREATMENT, SHORTHAND_CONTROL):
        raise ConfigError(f"--control {control!r} names no arm (speculative or baseline)")
    control = control or SHORTHAND_CONTROL
    return [
        Target(args.speculative, SHORTHAND_TREATMENT, control == SHORTHAND_TREATMENT),
        Target(args.baseline, SHORTHAND_CONTROL, control == SHORTHAND_CONTROL),
    ]


def _named_arms(pairs: list[str], control: str | None) -> list[Target]:
    """`--arm NAME=URL` repeated: n >= 2 arms with distinct names, one of them `--control`."""
    arms: dict[str, str] = {}
    for pair in pairs:
        name, _, url = pair.partition("=")
        name, url = name.strip(), url.strip()
        if not ARM_NAME_PATTERN.fullmatch(name) or not url:
            raise ConfigError(
                f"--arm {pair!r}: give NAME=URL, NAME a lower-case letter, then up to 31 of "
                "a-z 0-9 _ -"
            )
        if name in arms:
            raise ConfigError(f"--arm {name!r} is given twice")
        arms[name] = url
    if len(arms) < 2:
        raise ConfigError("--arm NAME=URL drives two or more arms (one endpoint: --url)")
    if control is None:
        raise ConfigError(f"name the control arm: --control one of {', '.join(arms)}")
    if control not in arms:
        raise ConfigError(f"--control {control!r} names no --arm ({', '.join(arms)})")
    return [Target(url, name, name == control) for name, url in arms.items()]


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
    """Per treatment and metric: median and P99 speedups with their 95% CIs, or what they lack."""
    lines = []
    for treatment, comparison in block.comparisons.items():
        for metric, label in (("e2e", "E2E"), ("tpot", "TPOT")):
            cells = []
            for stat, ci in comparison.get(metric, {}).items():
                if ci["status"] == "ok":
                    cells.append(
                        f"{stat} {ci['estimate']:.2f}x [{ci['lower']:.2f}, {ci['upper']:.2f}]"
                    )
                else:
                    cells.append(f"{stat}: needs {max(ci['n_needed'].values())} more per arm")
            if cells:
                lines.append(
                    f"{label} speedup ({block.control} / {treatment}, 95% CI): " + "; ".join(cells)
                )
    return lines


def _throughput_lines(block: BlockResult) -> list[str]:
    """Per arm over its own duration (each arm runs its own stream), then all arms over the
    block's wall time; goodput with --goodput; requests per dataset category when labelled."""
    lines = []
    for s in block.arms:
        t = _arm_throughput(s)
        name = s.arm if s.arm is not None else "proxy"
        lines.append(_throughput_text(name, t))
        if s.good is not None:
            slo = ", ".join(f"{k} <= {v:g} ms" for k, v in block.goodput.items())
            lines.append(
                f"  goodput {name}: {t['requests_per_s'] * s.good / max(s.n, 1):.2f} req/s "
                f"({s.good} of {s.n} requests within {slo})"
            )
        if s.categories:
            counts = ", ".join(f"{c} {n}" for c, n in s.categories.items())
            lines.append(f"  categories {name}: {counts}")
    if len(block.arms) > 1:
        lines.append(_throughput_text("all", _block_throughput(block)))
    return lines


def _arm_throughput(s: ArmSummary) -> dict[str, float]:
    return _throughput(s.n, s.prompt_tokens, s.output_tokens, s.duration_s)


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
        arm["throughput"] = _arm_throughput(summary)
    data["throughput"] = _block_throughput(block)
    return data
