"""A separate OS process that records through the store, for the multi-process and SIGTERM tests.

    python -m tests.store.writer_proc URL --prefix P [--count N] [--spill PATH]

It records `--count` records (or, without it, until SIGTERM), printing `ack <n>` after every 100
acknowledged `record()` calls, then closes the store (the proxy's SIGTERM path) and prints
`final <acknowledged> <dropped>`.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import time

from specproxy.config import StoreConfig
from specproxy.records import RequestRecord
from specproxy.store.factory import open_store


def make_record(prefix: str, i: int, run_id: str = "procs") -> RequestRecord:
    return RequestRecord(
        request_id=f"{prefix}-{i}",
        run_id=run_id,
        arm="speculative" if i % 2 else "baseline",
        t_start=time.time(),
        model="tiny",
        endpoint="chat.completions",
        stream=True,
        status=200,
        e2e_s=0.1 + i * 1e-6,
        upstream_s=0.09,
        ttft_s=0.01,
        output_tokens=16,
    )


async def main(args: argparse.Namespace) -> None:
    cfg = StoreConfig(url=args.url, spill_path=args.spill, flush_interval_s=0.2, batch_size=500)
    store = open_store(cfg, run_id="procs")
    await store.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    acked = 0
    while not stop.is_set() and (args.count is None or acked < args.count):
        store.record(make_record(args.prefix, acked))
        acked += 1
        if acked % 100 == 0:
            print(f"ack {acked}", flush=True)
            await asyncio.sleep(0.001)
    await store.close()
    print(f"final {acked} {store.dropped}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--count", type=int, default=None)
    parser.add_argument("--spill", default="spill.jsonl")
    asyncio.run(main(parser.parse_args()))
    sys.exit(0)
