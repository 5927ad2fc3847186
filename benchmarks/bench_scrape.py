"""What does one engine scrape cost the proxy? Prints figures; asserts nothing.

The parse of a vLLM /metrics page runs in a worker thread (`asyncio.to_thread`), so the figure
that matters for the proxy's event loop is the fetch overhead, while the parse time says how much
CPU the scraper takes per arm and interval. It reports, for the real vLLM 0.32.0 spec page (and a
page with 8 data-parallel engines, 8x the samples):

- `parse_metrics` time per page (median of repeats);
- the derivation (`derive_sample`) time per pair of snapshots;
- the share of one core that scraping two arms every `interval_s` takes.

Run: .venv/bin/python benchmarks/bench_scrape.py [--repeats 200] [--interval 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

from specproxy.scrape.derive import derive_sample
from specproxy.scrape.parse import parse_metrics

FIXTURE = Path(__file__).parent.parent / "tests/fixtures/vllm-0.32.0-cpu/metrics_spec.prom"


def data_parallel_page(text: str, engines: int) -> str:
    """The page with every `engine="0"` series repeated for engines 0..engines-1."""
    out: list[str] = []
    for line in text.splitlines():
        if 'engine="0"' in line:
            out.extend(line.replace('engine="0"', f'engine="{i}"') for i in range(engines))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def time_ms(fn: Callable[[], object], repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0, help="scrape.interval_s")
    args = parser.parse_args()
    real = FIXTURE.read_text()
    for label, text in (("real 0.32.0 page", real), ("8 DP engines", data_parallel_page(real, 8))):
        parse_ms = time_ms(partial(parse_metrics, text, t=0.0), args.repeats)
        a, b = parse_metrics(text, t=0.0), parse_metrics(text, t=5.0)
        derive = partial(derive_sample, a, b, run_id="r", arm="speculative")
        derive_ms = time_ms(derive, args.repeats)
        share = 2 * (parse_ms + derive_ms) / 1e3 / args.interval
        print(
            f"{label:>18}: {len(text) / 1024:6.1f} KiB, parse {parse_ms:6.2f} ms, "
            f"derive {derive_ms * 1e3:6.1f} us, two arms every {args.interval:g} s = "
            f"{share:.3%} of a core"
        )


if __name__ == "__main__":
    main()
