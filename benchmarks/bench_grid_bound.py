"""How far below a reported CI the log grid's error bound lies, by sample size.

Every statistic reads histograms on the fixed log grid (`summary.grid`): a quantile ratio's CI
bound moves by at most `GRID_ERROR_BOUND` (0.02 %) on fine data, `COARSE_ERROR_BOUND` (0.5 %)
on compacted blocks. This prints, per arm size n and statistic, the half-width of the 95 % CI of
the speedup (log scale) from the production estimator (`value_speedup_intervals`: i.i.d. data,
lognormal latency with the given sigma, two arms 1.25x apart) and its ratio to each bound. A
time-block interval on serially correlated data is wider still, so these are the tightest CIs.

    .venv/bin/python benchmarks/bench_grid_bound.py [--sigma 0.5] [--max-n 1000000]
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from specproxy.stats.estimate.blockboot import value_speedup_intervals
from specproxy.summary.grid import COARSE_ERROR_BOUND, GRID_ERROR_BOUND

STATISTICS = ("median", "mean", "p90", "p99")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sigma", type=float, default=0.5, help="log-sd of the latencies")
    parser.add_argument("--max-n", type=int, default=1_000_000, help="largest arm size")
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()
    fine, coarse = math.log1p(GRID_ERROR_BOUND), math.log1p(COARSE_ERROR_BOUND)
    print(
        f"grid bounds on a ratio: fine {GRID_ERROR_BOUND:.4%}, compacted {COARSE_ERROR_BOUND:.3%}"
    )
    print(f"{'n/arm':>10} {'stat':>6} {'CI half-width':>14} {'/ fine':>8} {'/ compacted':>12}")
    rng = np.random.default_rng(0)
    n = 400
    while n <= args.max_n:
        base = rng.lognormal(0.0, args.sigma, n)
        spec = rng.lognormal(0.0, args.sigma, n) / 1.25
        cis = value_speedup_intervals(
            base, spec, statistics=STATISTICS, rng=rng, resamples=args.resamples
        )
        for stat in STATISTICS:
            ci = cis[stat]
            half = math.log(ci.upper / ci.lower) / 2
            print(f"{n:>10} {stat:>6} {half:>14.4%} {half / fine:>8.0f} {half / coarse:>12.1f}")
        n *= 10


if __name__ == "__main__":
    main()
