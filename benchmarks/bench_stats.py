"""Time the speedup CIs (median, mean, P90, P99; 2,000 resamples) at 1M samples per arm.

The target is under 2 s for one metric at 1M/arm; above 20,000 samples per arm the Poisson
bootstrap over log-spaced histograms is used. Also times one full window comparison (three
metrics, rank tests, sequential tests, adjustment) at 200k per arm.

    .venv/bin/python benchmarks/bench_stats.py
"""

from __future__ import annotations

import time

import numpy as np

from specproxy.records import Arm
from specproxy.stats.compare import CompareSettings, compare_window
from specproxy.stats.estimate.bootstrap import split_speedup_intervals
from specproxy.stats.estimate.quantile import STATISTICS


def bench_intervals(n: int, repeats: int = 3) -> None:
    rng = np.random.default_rng(0)
    base, spec = rng.lognormal(0.0, 0.5, n), rng.lognormal(-0.1, 0.6, n)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = split_speedup_intervals(base, spec, statistics=STATISTICS, rng=rng, resamples=2000)
        times.append(time.perf_counter() - start)
    print(
        f"speedup CIs, 4 statistics, {n:,} samples/arm, 2000 resamples: "
        f"best {min(times):.2f} s, median {float(np.median(times)):.2f} s"
    )
    for stat, ci in out.items():
        print(f"  {stat:<6} {ci.estimate:.4f} [{ci.lower:.4f}, {ci.upper:.4f}]")


def bench_window(n: int) -> None:
    rng = np.random.default_rng(1)
    arrays = {}
    for arm, scale in ((Arm.BASELINE, 1.0), (Arm.SPECULATIVE, 0.8)):
        tokens = rng.integers(20, 400, n).astype(float)
        tpot = rng.lognormal(np.log(0.02 * scale), 0.2, n)
        ttft = rng.lognormal(np.log(0.1), 0.3, n)
        arrays[arm] = {
            "t_start": np.arange(n, dtype=float),
            "model": np.full(n, "m", dtype=object),
            "status": np.full(n, 200.0),
            "error_kind": np.full(n, None, dtype=object),
            "disconnected": np.zeros(n, dtype=bool),
            "shadow": np.zeros(n, dtype=bool),
            "pair_id": np.full(n, None, dtype=object),
            "e2e_s": ttft + tpot * (tokens - 1),
            "ttft_s": ttft,
            "tpot_s": tpot,
            "prompt_tokens": rng.integers(10, 1000, n).astype(float),
            "output_tokens": tokens,
        }
    start = time.perf_counter()
    compare_window(arrays, engine={}, settings=CompareSettings(), rng=rng)
    print(
        f"full window comparison (3 metrics, all tests), {n:,} samples/arm: "
        f"{time.perf_counter() - start:.2f} s"
    )


if __name__ == "__main__":
    bench_intervals(1_000_000)
    bench_window(200_000)
