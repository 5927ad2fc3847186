"""Known-truth A/B/n runs: per-comparison CI coverage and how often the best-configuration answer
names the true best once the data separate the treatments, through the production estimators.

Each run draws a control and treatments whose true speedups differ (lognormal latencies, sd 0.5
in log, a treatment's divided by its speedup; Poisson arrivals, `rate` per second per arm, over
`seconds`), as minute-unit `ArmSample`s, then for every treatment the E2E median speedup's time
block interval (`block_speedup_intervals`, 95 %) and the answer of `stats.best` (the leader by
estimate; "winner" when the anytime-valid median CS of every other treatment over the leader
lies above 1 at alpha / m).

    nice -n 10 .venv/bin/python -m benchmarks.study_abn_known_truth --runs 400

prints each comparison's coverage (with its Monte Carlo standard error), the share of runs with
a winner, and the share of those whose winner is the true best.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence

import numpy as np

from specproxy.stats.anytime.sequential import ratio_bounds
from specproxy.stats.estimate.blockboot import block_speedup_intervals
from specproxy.stats.sample import ArmSample

__all__ = ["main", "run_once"]

UNIT_S = 60.0
SETS = {
    "three": {"base": 1.0, "k2": 1.2, "k4": 1.45},
    "four": {"base": 1.0, "k2": 1.15, "eagle": 1.3, "k4": 1.45},
}


def _arm(rng: np.random.Generator, speedup: float, seconds: float, rate: float) -> ArmSample:
    n = rng.poisson(rate * seconds)
    t = rng.uniform(0.0, seconds, n)
    values = rng.lognormal(0.0, 0.5, n) / speedup
    unit = np.floor(t / UNIT_S).astype(np.int64)
    return ArmSample.from_values(values, unit, math.ceil(seconds / UNIT_S), UNIT_S)


def run_once(
    rng: np.random.Generator, truth: dict[str, float], *, seconds: float, rate: float
) -> tuple[dict[str, bool], str | None]:
    """({treatment: its CI covers the truth}, the winner or None)."""
    control, *treatments = truth
    samples = {arm: _arm(rng, s, seconds, rate) for arm, s in truth.items()}
    covered: dict[str, bool] = {}
    estimates: dict[str, float] = {}
    for arm in treatments:
        boot = block_speedup_intervals(
            samples[control], samples[arm], statistics=("median",), rng=rng, resamples=999
        )
        ci = boot.intervals["median"].interval
        covered[arm] = ci.lower <= truth[arm] <= ci.upper
        estimates[arm] = ci.estimate
    leader = max(estimates, key=lambda a: estimates[a])
    level = 0.05 / len(treatments)
    separated = all(
        ratio_bounds(samples[leader], samples[other], 0.5, level)[0] > 1.0
        for other in treatments
        if other != leader
    )
    return covered, leader if separated else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for name, truth in SETS.items():
        hits = dict.fromkeys(list(truth)[1:], 0)
        winners = right = 0
        for _ in range(args.runs):
            covered, winner = run_once(rng, truth, seconds=args.seconds, rate=args.rate)
            for arm, ok in covered.items():
                hits[arm] += ok
            if winner is not None:
                winners += 1
                right += winner == max(truth, key=lambda a: truth[a])
        se = math.sqrt(0.95 * 0.05 / args.runs)
        cover = ", ".join(f"{arm} {h / args.runs:.3f}" for arm, h in hits.items())
        print(
            f"{name} arms {truth}: median CI coverage {cover} (MC se {se:.3f});"
            f" winner named in {winners}/{args.runs} runs, the true best in {right}/{winners}"
        )


if __name__ == "__main__":
    main()
