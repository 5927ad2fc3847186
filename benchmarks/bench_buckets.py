"""How accurate is Grafana's P99 (`histogram_quantile`) for a given set of latency buckets?

Prints figures; asserts nothing. For each candidate bucket set it draws latency samples from a
grid of lognormal distributions (median 5 ms .. 30 s, log-sd 0.1 .. 1.0: from a steady TPOT to a
long-tailed E2E), bins them, and compares Prometheus's `histogram_quantile` (linear interpolation
inside the bucket, as promql/quantile.go does) with the exact sample quantile. It reports the
median and the worst relative error of P50 and P99 over the grid, and how many bucket series one
proxy exports with that set (every latency histogram's label combinations x (buckets + 1)).

The sampling error of the exact quantile itself is not part of the figure: both sides see the
same samples, so the error printed is the bucketing error alone.

Run: .venv/bin/python benchmarks/bench_buckets.py [--samples 20000] [--seed 1]
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import numpy as np

from specproxy.metrics import LATENCY_BUCKETS, histogram_quantile, log_buckets

# Label combinations of the proxy's latency histograms: arm x endpoint x stream for the request
# duration, arm x endpoint for TTFT and TPOT, arm for the event gap (2 arms, 2 endpoints).
LATENCY_SERIES = 2 * 2 * 2 + 2 * 2 + 2 * 2 + 2

CANDIDATES: dict[str, Sequence[float]] = {
    "log 1.10 (1 ms..600 s), old": log_buckets(0.001, 600.0, 1.1),
    "log 1.25 (1 ms..600 s)": log_buckets(0.001, 600.0, 1.25),
    "log 2^(1/3) (1 ms..600 s)": log_buckets(0.001, 600.0, 2 ** (1 / 3)),
    "log 2^(1/4) (1 ms..600 s)": log_buckets(0.001, 600.0, 2 ** (1 / 4)),
    "log 2^(1/3) (1 ms..300 s)": log_buckets(0.001, 300.0, 2 ** (1 / 3)),
    "log 1.5 (1 ms..600 s)": log_buckets(0.001, 600.0, 1.5),
    "log 2 (1 ms..600 s)": log_buckets(0.001, 600.0, 2.0),
    "1-2-5 (1 ms..500 s)": tuple(m * 10.0**e for e in range(-3, 3) for m in (1, 2, 5)),
    "current (LATENCY_BUCKETS)": LATENCY_BUCKETS,
}


def errors(
    bounds: Sequence[float], samples: int, rng: np.random.Generator
) -> dict[float, list[float]]:
    found: dict[float, list[float]] = {0.5: [], 0.99: []}
    edges = np.asarray(bounds)
    for median in (0.005, 0.02, 0.1, 0.5, 2.0, 8.0, 30.0):
        for sigma in (0.1, 0.25, 0.5, 1.0):
            x = rng.lognormal(math.log(median), sigma, samples)
            counts = np.bincount(np.searchsorted(edges, x, side="left"), minlength=len(edges) + 1)
            for q in found:
                exact = float(np.quantile(x, q))
                estimate = histogram_quantile(q, bounds, counts.tolist())
                found[q].append(abs(estimate / exact - 1.0))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=20000, help="samples per distribution")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(
        f"{'bucket set':<28}{'buckets':>8}{'series':>8}"
        f"{'P50 med':>9}{'P50 max':>9}{'P99 med':>9}{'P99 max':>9}"
    )
    for name, bounds in CANDIDATES.items():
        found = errors(bounds, args.samples, np.random.default_rng(args.seed))
        row = [f"{100 * float(np.median(found[q])):.1f}%" for q in (0.5,)]
        row.append(f"{100 * max(found[0.5]):.1f}%")
        row += [f"{100 * float(np.median(found[0.99])):.1f}%", f"{100 * max(found[0.99]):.1f}%"]
        series = LATENCY_SERIES * (len(bounds) + 1)
        print(f"{name:<28}{len(bounds):>8}{series:>8}" + "".join(f"{v:>9}" for v in row))


if __name__ == "__main__":
    main()
