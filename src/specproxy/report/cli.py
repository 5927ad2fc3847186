"""`specproxy report --store URL --out DIR`: write the report of one run (`build.write_report`)."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.extras import require
from specproxy.records import arm_name

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=StoreConfig().url, help="store URL (sqlite:///, postgresql://)"
    )
    parser.add_argument("--out", default="out/report", help="output directory")
    parser.add_argument("--run-id", help="run to report (default: the run with the latest record)")
    parser.add_argument(
        "--control",
        type=arm_name,
        metavar="NAME",
        help="the control arm of a run without a stored stats result (a bench or ingest run with"
        " named arms), every other arm a treatment (default: the stored result's arms, else"
        " 'baseline')",
    )
    parser.add_argument(
        "--warmup-requests",
        type=int,
        default=WarmupConfig().requests,
        help="requests per arm left out at the start and after each engine restart",
    )
    parser.add_argument(
        "--resamples", type=int, default=StatsConfig().resamples, help="bootstrap resamples"
    )


def run(args: argparse.Namespace) -> int:
    require("matplotlib", "specproxy report")  # before anything is read or written
    from specproxy.report.build import write_report
    from specproxy.store.sqlite import require_existing_store

    require_existing_store(args.store)
    out = asyncio.run(
        write_report(
            args.store,
            run_id=args.run_id,
            out_dir=Path(args.out),
            settings=StatsConfig(resamples=args.resamples),
            warmup=WarmupConfig(requests=args.warmup_requests),
            control=args.control,
        )
    )
    if out is None:
        print(f"no records in {args.store}" + (f" for run {args.run_id}" if args.run_id else ""))
        return 1
    print(f"report: {out / 'index.html'}")
    return 0
