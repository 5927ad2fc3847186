"""Known-truth A/B/n runs: per-comparison CI coverage and how often the best-configuration answer
names the true best once the data separate the treatments, through the production code.

Each run draws a control and treatments whose true speedups differ (lognormal latencies, sd 0.5
in log, a treatment's divided by its speedup; Poisson arrivals, `rate` per second per arm, over
`seconds`) and looks `looks` times at equal steps, as the live job does. At each look every
treatment is compared with the control by `stats.compare.compare_window` (minute-unit
`ArmSample`s of E2E latency; its tests at alpha / m, as `stats.job.tick` runs them) and the
answer is `stats.best.best_configuration` on those comparisons: the leader by E2E median
speedup, "winner" once the anytime-valid median confidence sequence of every other treatment
over the leader lies above 1 at alpha / m, else "no winner yet".

Per set it prints:
- each comparison's E2E median interval coverage at the last look (the shown 95 % block
  bootstrap interval; Monte Carlo standard error beside it);
- the runs in which a winner was named at some look, and in how many of those the first winner
  named was the true best (the answer a user acts on);
- the runs in which a wrong winner was named at any look.

    nice -n 10 .venv/bin/python -m benchmarks.study_abn_known_truth --runs 400

`--sets` picks the sets (default: all): "three" and "four" differ widely (the winner comes
early), "close" holds two treatments 6 % apart, so the answer stays "no winner yet" for longer
and a wrong winner would show.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from specproxy.stats.best import BEST_METRIC, BEST_STATISTIC, best_configuration
from specproxy.stats.compare import CompareSettings, compare_window
from specproxy.stats.result import WindowComparison
from specproxy.stats.sample import ArmSample, ArmWindow

__all__ = ["Outcome", "main", "run_once"]

UNIT_S = 60.0
ALPHA = 0.05
CONFIDENCE = 0.95
SETS = {
    "three": {"base": 1.0, "k2": 1.2, "k4": 1.45},
    "four": {"base": 1.0, "k2": 1.15, "eagle": 1.3, "k4": 1.45},
    "close": {"base": 1.0, "k2": 1.3, "k4": 1.38},
}


@dataclass
class Outcome:
    """One run: each treatment's last-look coverage; the first winner named (and its look);
    whether any look named a winner that is not the true best."""

    covered: dict[str, bool] = field(default_factory=dict)
    first_winner: str | None = None
    first_look: int | None = None
    wrong_winner: bool = False


def _draw(
    rng: np.random.Generator, speedup: float, seconds: float, rate: float
) -> tuple[np.ndarray, np.ndarray]:
    n = rng.poisson(rate * seconds)
    return rng.lognormal(0.0, 0.5, n) / speedup, rng.uniform(0.0, seconds, n)


def _window(values: np.ndarray, t: np.ndarray, end: float) -> ArmWindow:
    keep = t < end
    unit = np.floor(t[keep] / UNIT_S).astype(np.int64)
    sample = ArmSample.from_values(values[keep], unit, math.ceil(end / UNIT_S), UNIT_S)
    return ArmWindow({BEST_METRIC: sample})


def run_once(
    rng: np.random.Generator,
    truth: dict[str, float],
    *,
    seconds: float,
    rate: float,
    looks: int,
    resamples: int = 999,
) -> Outcome:
    control, *treatments = truth
    best_arm = max(treatments, key=lambda a: truth[a])
    drawn = {arm: _draw(rng, s, seconds, rate) for arm, s in truth.items()}
    settings = CompareSettings(resamples=resamples, alpha=ALPHA / len(treatments))
    seed = [int(x) for x in rng.integers(0, 2**31, 2)]
    outcome = Outcome()
    for look in range(1, looks + 1):
        end = seconds * look / looks
        windows = {arm: _window(*drawn[arm], end) for arm in truth}
        comparisons: dict[str, WindowComparison] = {
            arm: compare_window(
                windows[control],
                windows[arm],
                engine={},
                settings=settings,
                seed=[*seed, look, i],
                names=(control, arm),
            )
            for i, arm in enumerate(treatments)
        }
        best = best_configuration(
            comparisons,
            {arm: windows[arm].sample(BEST_METRIC) for arm in treatments},
            alpha_each=settings.alpha,
            confidence=CONFIDENCE,
            resamples=resamples,
            rng=rng,
        )
        if best["state"] == "winner":
            if outcome.first_winner is None:
                outcome.first_winner, outcome.first_look = best["leader"], look
            outcome.wrong_winner |= best["leader"] != best_arm
        if look == looks:
            for arm, comparison in comparisons.items():
                ci = comparison["metrics"][BEST_METRIC]["speedup"][BEST_STATISTIC]
                lower, upper = ci["lower"], ci["upper"]
                outcome.covered[arm] = (
                    lower is not None and upper is not None and lower <= truth[arm] <= upper
                )
    return outcome


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--seconds", type=float, default=1800.0)
    parser.add_argument("--rate", type=float, default=2.0)
    parser.add_argument("--looks", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sets", nargs="+", choices=sorted(SETS), default=list(SETS))
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    for name in args.sets:
        truth = SETS[name]
        best_arm = max(list(truth)[1:], key=lambda a: truth[a])
        hits = dict.fromkeys(list(truth)[1:], 0)
        winners = right = wrong = 0
        looks_taken: list[int] = []
        for _ in range(args.runs):
            out = run_once(rng, truth, seconds=args.seconds, rate=args.rate, looks=args.looks)
            for arm, ok in out.covered.items():
                hits[arm] += ok
            if out.first_winner is not None and out.first_look is not None:
                winners += 1
                right += out.first_winner == best_arm
                looks_taken.append(out.first_look)
            wrong += out.wrong_winner
        se = math.sqrt(0.95 * 0.05 / args.runs)
        cover = ", ".join(f"{arm} {h / args.runs:.3f}" for arm, h in hits.items())
        when = f", first at look {np.median(looks_taken):g} (median)" if looks_taken else ""
        print(
            f"{name} arms {truth}, {args.looks} looks over {args.seconds:g} s at"
            f" {args.rate:g} req/s per arm: E2E median CI coverage {cover} (MC se {se:.3f});"
            f" winner named in {winners}/{args.runs} runs{when}; the first winner is the true"
            f" best ({best_arm}) in {right}/{winners}; a wrong winner at any look in"
            f" {wrong}/{args.runs}",
            flush=True,
        )


if __name__ == "__main__":
    main()
