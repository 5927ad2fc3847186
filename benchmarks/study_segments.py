"""Coverage of the conditional speedups (`stats.segments`) and of the crossover load
(`stats.estimate.crossover`) against known truths: the study behind issue 26's Done means.

1. Categories: three categories whose speedups (TPOT, in law) are 2.0, 1.4 and 1.1; lognormal
   TPOTs with a per-unit level the arms share (`tests.stats.test_segments.category_run`). Printed:
   the share of per-category 95 % intervals that hold their category's speedup, with its
   Monte-Carlo SE.
2. Crossover: both arms through the emulator's engine on a virtual clock, three passes over 15
   closed-loop concurrency levels from 1 to 40 (`tests.stats.estimate.test_crossover.
   emulated_window`); the truth is the model's own crossover (`emulator.model.
   crossover_concurrency`, 4,000 requests per level). Printed: the truth, the share of runs whose
   interval holds it, the estimates' mean and sd, the intervals' median width.

    .venv/bin/python -m benchmarks.study_segments [--category-runs 200] [--crossover-runs 30]
"""

from __future__ import annotations

import argparse
import math
import time

import numpy as np
from tests.stats.estimate.test_crossover import BASELINE, MAX_TOKENS, SPECULATIVE, emulated_window
from tests.stats.test_segments import category_coverage

from specproxy.emulator.model import crossover_concurrency
from specproxy.stats.estimate.crossover import crossover


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--category-runs", type=int, default=200)
    parser.add_argument("--crossover-runs", type=int, default=30)
    args = parser.parse_args()

    started = time.perf_counter()
    c = category_coverage(args.category_runs)
    n = 3 * args.category_runs
    print(
        f"categories: coverage {c:.3f} (SE {math.sqrt(c * (1 - c) / n):.3f}) of {n} intervals"
        f" [{time.perf_counter() - started:.0f} s]"
    )

    started = time.perf_counter()
    truth = crossover_concurrency(
        SPECULATIVE, BASELINE, low=1, high=64, requests=4000, max_tokens=MAX_TOKENS
    )
    assert truth is not None
    hits = 0
    estimates, widths = [], []
    for run in range(args.crossover_runs):
        control, treatment = emulated_window(run)
        found = crossover(
            control, treatment, units=200, rng=np.random.default_rng(run), resamples=500
        )
        lo = found.lower if found.lower is not None else -math.inf
        hi = found.upper if found.upper is not None else math.inf
        hits += lo <= truth <= hi
        if found.load is not None:
            estimates.append(found.load)
        widths.append(hi - lo)
    runs = args.crossover_runs
    share = hits / runs
    print(
        f"crossover: truth {truth:.2f}; coverage {share:.3f} (SE "
        f"{math.sqrt(share * (1 - share) / runs):.3f}) of {runs} runs; estimate mean "
        f"{np.mean(estimates):.2f} sd {np.std(estimates):.2f}; median width "
        f"{np.median(widths):.2f} [{time.perf_counter() - started:.0f} s]"
    )


if __name__ == "__main__":
    main()
