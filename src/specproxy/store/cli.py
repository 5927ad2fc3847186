"""`specproxy export`: write a store's request records as CSV, Parquet or JSON lines."""

from __future__ import annotations

import argparse
import asyncio
import sys

from specproxy.config import StoreConfig
from specproxy.store.export import FORMATS, export

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--store", default=StoreConfig().url, help="store URL (default: %(default)s)"
    )
    parser.add_argument("--format", choices=FORMATS, default="csv", help="output format")
    parser.add_argument("--run-id", default=None, help="only this run (default: every run)")
    parser.add_argument("--out", default="-", help="output file; '-' is stdout (not for parquet)")


def run(args: argparse.Namespace) -> int:
    count = asyncio.run(export(args.store, args.format, out=args.out, run_id=args.run_id))
    print(f"exported {count} records", file=sys.stderr)
    return 0
