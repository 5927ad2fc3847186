"""The guarded ramp's work per tick against the age of its step: it must not grow with it.

A step held at 50% with `--rate` requests a second (default 1,000, split evenly; E2E
lognormal(0, 0.5) x 1 s, 1% errors), one tick a minute folding that minute's requests into the
step's `stats.rampguard.StepGuard` (the job feeds it the requests that ended since its last read)
and looking. Printed at some step ages: the requests the tick folded in, what re-reading the
step would have read instead (every request since the step began: what the job did before), the
minutes the guard keeps open to late requests and their histogram entries, and the seconds of
the fold and the look (one core, whatever else the machine runs: compare the columns, not the
absolute numbers). The default horizon is the default timeouts' longest request (3,605 s), so
the open minutes, and with them the work, level off after an hour.

    nice -n 10 .venv/bin/python -m benchmarks.ramp_tick [--rate 1000] [--minutes 150]

prints the figures; asserts nothing (tests/stats/job/test_ramp.py asserts the reads per tick).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

from specproxy.stats.job.ramp import DEFAULT_HORIZON_S
from specproxy.stats.rampguard import StepGuard, StepRows

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=1000.0, help="requests a second, both arms")
    parser.add_argument("--minutes", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    guard = StepGuard(alpha=0.025, tolerance=0.05, steps=4, revise_s=DEFAULT_HORIZON_S)
    guard.begin(since=0.0, basis=1)
    per_arm = round(args.rate * 30.0)  # a minute's requests of one arm at 50%
    shown = {1, 10, 30, 60, 61, 62, 63, 65, 90, 120, args.minutes}
    print(
        f"{args.rate:,.0f} requests a second at 50%, horizon {DEFAULT_HORIZON_S:,.0f} s\n"
        "step age (min) | folded this tick | a re-read would read | open minutes | open entries"
        " | fold s | look s"
    )
    for minute in range(args.minutes):
        errored = [rng.random(per_arm) < 0.01 for _ in range(2)]
        rows = [
            StepRows.of(
                np.full(per_arm, minute), rng.lognormal(0.0, 0.5, per_arm), errored=e, usable=~e
            )
            for e in errored
        ]
        start = time.perf_counter()
        guard.fold(rows[0], rows[1], until=60.0 * (minute + 1))
        folded = time.perf_counter() - start
        start = time.perf_counter()
        guard.look(at=60.0 * (minute + 1))
        looked = time.perf_counter() - start
        if minute + 1 in shown:
            minutes, entries = guard.open_minutes()
            print(
                f"{minute + 1:14d} | {2 * per_arm:16,d} | {2 * per_arm * (minute + 1):20,d} |"
                f" {minutes:12d} | {entries:12,d} | {folded:6.3f} | {looked:6.3f}"
            )


if __name__ == "__main__":
    main()
