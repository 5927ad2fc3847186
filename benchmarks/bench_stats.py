"""Time the speedup CIs (median, mean, P90, P99; 2,000 resamples) at 1M samples per arm.

The target is under 2 s for one metric at 1M/arm: `value_speedup_intervals` bins both arms on
the fixed log grid (`ArmSample.from_values`, as the store's writer) and resamples the histograms
(quantiles by exact order-statistic draws, the mean by its Poisson bootstrap's normal limit).
Also times one full window comparison (`compare_window`: three metrics in minute units with their
moments, block and i.i.d. intervals, rank tests, anytime-valid evidence, length adjustment) at
200k per arm.

    .venv/bin/python benchmarks/bench_stats.py [--n 1000000] [--window-n 200000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import numpy.typing as npt

from specproxy.stats.compare import CompareSettings, compare_window
from specproxy.stats.estimate.blockboot import value_speedup_intervals
from specproxy.stats.estimate.quantile import STATISTICS
from specproxy.stats.sample import ArmSample, ArmWindow
from specproxy.summary.minute import MOMENT_SUMS

FloatArray = npt.NDArray[np.float64]


def bench_intervals(n: int, repeats: int = 3) -> None:
    rng = np.random.default_rng(0)
    base, spec = rng.lognormal(0.0, 0.5, n), rng.lognormal(-0.1, 0.6, n)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        out = value_speedup_intervals(base, spec, statistics=STATISTICS, rng=rng, resamples=2000)
        times.append(time.perf_counter() - start)
    print(
        f"speedup CIs, 4 statistics, {n:,} samples/arm, 2000 resamples: "
        f"best {min(times):.2f} s, median {float(np.median(times)):.2f} s"
    )
    for stat, ci in out.items():
        print(f"  {stat:<6} {ci.estimate:.4f} [{ci.lower:.4f}, {ci.upper:.4f}]")


def _arm_window(rng: np.random.Generator, n: int, scale: float) -> ArmWindow:
    """One arm of a window: a request a second, in minute units, as the store summarises it."""
    tokens = rng.integers(20, 400, n).astype(np.float64)
    prompt = rng.integers(10, 1000, n).astype(np.float64)
    tpot = rng.lognormal(np.log(0.02 * scale), 0.2, n)
    ttft = rng.lognormal(np.log(0.1), 0.3, n)
    e2e = ttft + tpot * (tokens - 1)
    unit = np.arange(n) // 60
    units = int(unit[-1]) + 1
    samples = {
        name: ArmSample.from_values(values, unit, units)
        for name, values in (("e2e", e2e), ("ttft", ttft), ("tpot", tpot))
    }
    y, u, v = np.log(e2e), np.log(tokens), np.log(prompt)
    columns: tuple[FloatArray, ...] = (
        np.ones(n), u, v, u * u, v * v, u * v, y, u * y, v * y, y * y
    )  # fmt: skip
    assert len(columns) == len(MOMENT_SUMS)
    moments = np.stack(
        [np.bincount(unit, weights=c, minlength=units) for c in columns], axis=1
    ).astype(np.float64)
    return ArmWindow(samples, moments)


def bench_window(n: int) -> None:
    rng = np.random.default_rng(1)
    control, treatment = _arm_window(rng, n, 1.0), _arm_window(rng, n, 0.8)
    start = time.perf_counter()
    result = compare_window(
        control, treatment, engine={}, settings=CompareSettings(), seed=[1, 2, 3]
    )
    elapsed = time.perf_counter() - start
    e2e = result["metrics"]["e2e"]
    median = e2e["speedup"]["median"]
    shown = ", ".join(f"{median[k] or float('nan'):.4f}" for k in ("estimate", "lower", "upper"))
    print(
        f"full window comparison (3 metrics, all tests), {n:,} samples/arm: {elapsed:.2f} s"
        f" (e2e median speedup {shown}, {median['method']} interval; verdict {e2e['verdict']})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="samples per arm, CIs")
    parser.add_argument("--window-n", type=int, default=200_000, help="samples per arm, window")
    args = parser.parse_args()
    bench_intervals(args.n)
    bench_window(args.window_n)


if __name__ == "__main__":
    main()
