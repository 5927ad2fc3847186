"""`specproxy ingest FILE --arm ARM`: store a `vllm bench serve --save-detailed` result.

Run it once per arm into the same `--run-id`; then `specproxy stats --run-id ID` and
`specproxy report --run-id ID` compare the two like a run the proxy recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json

from specproxy.bench.ingest import records_from_vllm_bench
from specproxy.config import StoreConfig
from specproxy.errors import ConfigError
from specproxy.records import arm_name

__all__ = ["configure", "run"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", help="JSON written by vllm bench serve --save-result --save-detailed"
    )
    parser.add_argument(
        "--arm", required=True, type=arm_name, help="the arm the run measured (its name)"
    )
    parser.add_argument("--run-id", required=True, help="store run to add it to (both arms: one)")
    parser.add_argument("--store", default=StoreConfig().url, help="store URL")
    parser.add_argument("--model", help="model name to record (default: the result's model_id)")


async def _write(args: argparse.Namespace, result: dict[str, object]) -> int:
    from specproxy.store.factory import open_store

    records = records_from_vllm_bench(result, arm=args.arm, run_id=args.run_id, model=args.model)
    store = open_store(StoreConfig(url=args.store), run_id=args.run_id)
    await store.start()
    try:
        for record in records:
            store.record(record)
        await store.flush()
    finally:
        await store.close()
    return len(records)


def run(args: argparse.Namespace) -> int:
    try:
        with open(args.file, encoding="utf-8") as fh:
            result = json.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read {args.file}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{args.file} is not JSON: {exc}") from exc
    if not isinstance(result, dict):
        raise ConfigError(f"{args.file}: not a vllm bench serve result")
    count = asyncio.run(_write(args, result))
    print(f"ingested {count} requests as {args.arm} into {args.store}, run {args.run_id}")
    return 0
