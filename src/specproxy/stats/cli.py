"""`specproxy stats --store URL`: compute the comparison once from a store and print it.

The text report gives, per model and window, the design, the sample sizes, each metric's verdict
and speedup CIs, and the diagnosis; `--json` prints the full result (schema in `stats.result`).
"""

from __future__ import annotations

import argparse
import asyncio

from specproxy.config import StatsConfig, StoreConfig
from specproxy.stats.job.runner import compute_stats
from specproxy.stats.result import P99Verdict, StatsResult, TwoSampleP99, to_json

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=StoreConfig().url, help="store URL (sqlite:///, postgresql://)"
    )
    parser.add_argument("--run-id", help="run to analyse (default: the only run, else 'default')")
    parser.add_argument("--json", action="store_true", help="print the full JSON result")
    parser.add_argument(
        "--resamples", type=int, default=StatsConfig().resamples, help="bootstrap resamples"
    )
    parser.add_argument("--seed", type=int, default=StatsConfig().seed, help="bootstrap seed")


def _p99_line(p99: P99Verdict) -> str:
    """The P99 verdict, which test decided, and each direction's log e-value vs its boundary
    (the design's e-process: per-minute exceedance on split traffic, two-sample on pairs)."""
    by = " + ".join(p99["decided_by"]) or "no test"

    def sides(tests: tuple[TwoSampleP99, TwoSampleP99]) -> str:
        out = []
        for side, test in zip(("slower", "faster"), tests, strict=True):
            stat = test["statistic"]
            shown = "n/a" if stat is None else f"{stat:.2f}"
            out.append(f"{side} log e {shown} / {test['boundary']:.2f}")
        return ", ".join(out)

    ran = "exceedance" in p99.get("tests", [])
    if ran and "exceedance_slower" in p99 and "exceedance_faster" in p99:
        pair = (p99["exceedance_slower"], p99["exceedance_faster"])
        return f"P99 {p99['verdict']} ({by}); per-minute exceedance " + sides(pair)
    line = f"P99 {p99['verdict']} ({by}); two-sample " + sides((p99["slower"], p99["faster"]))
    return line


def _text_report(result: StatsResult) -> str:
    lines = [f"run {result['run_id']}: windows end at {result['window_end']:.0f}"]
    for model, windows in result["results"].items():
        for window, res in windows.items():
            n = res["samples"]
            lines.append(
                f"\n[{model} / {window}] {res['design']}: baseline n={n['baseline']}, "
                f"speculative n={n['speculative']}"
            )
            for metric, block in res["metrics"].items():
                cells = []
                for stat, ci in block["speedup"].items():
                    estimate, lower, upper = ci["estimate"], ci["lower"], ci["upper"]
                    if ci["status"] != "ok" or estimate is None or lower is None or upper is None:
                        cells.append(f"{stat} insufficient")
                    else:
                        cells.append(f"{stat} {estimate:.3f} [{lower:.3f}, {upper:.3f}]")
                lines.append(f"  {metric:<5} {block['verdict']:<12} " + "; ".join(cells))
                seq = block["sequential"]
                if seq is not None and "p99" in seq:
                    lines.append(f"        {_p99_line(seq['p99'])}")
            lines.append(f"  diagnosis: {res['diagnosis']['summary']}")
            lines.extend(f"    - {r['message']}" for r in res["diagnosis"]["reasons"])
    return "\n".join(lines)


async def _run_once(args: argparse.Namespace) -> StatsResult:
    from specproxy.store.factory import open_store
    from specproxy.store.sqlite import require_existing_store

    stats_cfg = StatsConfig(resamples=args.resamples, seed=args.seed)  # validated before I/O
    require_existing_store(args.store)
    store = open_store(StoreConfig(url=args.store))
    await store.start(read_only=True)
    try:
        run_id = args.run_id
        if run_id is None:
            runs = await store.run_ids()
            run_id = runs[0] if len(runs) == 1 else "default"
        return await compute_stats(store, run_id=run_id, stats_cfg=stats_cfg)
    finally:
        await store.close()


def run(args: argparse.Namespace) -> int:
    result = asyncio.run(_run_once(args))
    print(to_json(result, indent=2) if args.json else _text_report(result))
    return 0
