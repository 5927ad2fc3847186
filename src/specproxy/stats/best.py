"""The A/B/n "best configuration" answer of one window: which treatment leads, by how much over
the runner-up, and whether the data separate them yet (pure; docs/statistics.md, "A/B/n").

The leader is the treatment with the largest E2E median speedup over the control. Its margin is
speedup(leader) / speedup(runner-up) = median(runner-up) / median(leader): the control cancels,
so it is computed on the two treatments' samples alone, with the block bootstrap resampling the
same time blocks of both (`estimate.blockboot`), at the displayed confidence. The answer is
"winner" once the anytime-valid confidence sequence of median(other) / median(leader) lies above
1 for every other treatment, each at the comparisons' level alpha / m (`Multiplicity`), so that
a winner is named falsely with probability at most alpha at any look; "no_winner_yet" until
then; "single" with one treatment (its comparison with the control says it all).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final

import numpy as np

from specproxy.records import Arm
from specproxy.stats.anytime.sequential import ratio_bounds
from specproxy.stats.estimate.blockboot import block_speedup_intervals
from specproxy.stats.result import Best, Interval, WindowComparison
from specproxy.stats.sample import ArmSample

__all__ = ["BEST_METRIC", "BEST_STATISTIC", "best_configuration", "speedup_of"]

BEST_METRIC: Final = "e2e"
BEST_STATISTIC: Final = "median"


def speedup_of(comparison: WindowComparison) -> float | None:
    """A comparison's E2E median speedup estimate (None while insufficient)."""
    block = comparison["metrics"][BEST_METRIC]["speedup"][BEST_STATISTIC]
    estimate = block["estimate"] if block["status"] == "ok" else None
    return float(estimate) if estimate is not None and math.isfinite(estimate) else None


def best_configuration(
    comparisons: Mapping[Arm, WindowComparison],
    samples: Mapping[Arm, ArmSample],
    *,
    alpha_each: float,
    confidence: float,
    resamples: int,
    rng: np.random.Generator,
) -> Best:
    """The answer from every treatment's comparison (`comparisons`) and E2E sample (`samples`,
    on the window's units); `alpha_each` is each comparison's level (alpha / m)."""
    speedups = {arm: speedup_of(c) for arm, c in comparisons.items()}
    base: Best = {
        "metric": BEST_METRIC,
        "statistic": BEST_STATISTIC,
        "state": "single" if len(comparisons) < 2 else "no_winner_yet",
        "leader": None,
        "runner_up": None,
        "speedups": speedups,
        "margin": None,
        "separated_from": [],
        "level": alpha_each,
        "reason": "",
    }
    ranked = sorted(
        (arm for arm, s in speedups.items() if s is not None),
        key=lambda arm: -(speedups[arm] or 0.0),
    )
    if len(comparisons) < 2:
        base["leader"] = ranked[0] if ranked else None
        base["reason"] = "one treatment: its comparison with the control is the answer"
        return base
    if len(ranked) < 2:
        base["reason"] = "fewer than two treatments have enough samples for an E2E median"
        return base
    leader, runner_up = ranked[0], ranked[1]
    base["leader"], base["runner_up"] = leader, runner_up
    base["margin"] = _margin(samples[runner_up], samples[leader], confidence, resamples, rng)
    separated = _separated(leader, samples, alpha_each)
    base["separated_from"] = separated
    others = [arm for arm in comparisons if arm != leader]
    if len(separated) == len(others):
        base["state"] = "winner"
        base["reason"] = (
            f"{leader} is faster than every other treatment (E2E median, anytime-valid at level"
            f" {alpha_each:.3g} each)"
        )
    else:
        pending = [arm for arm in others if arm not in separated]
        base["reason"] = (
            f"{leader} leads, but the data do not yet separate it from {', '.join(pending)}"
        )
    return base


def _margin(
    runner_up: ArmSample,
    leader: ArmSample,
    confidence: float,
    resamples: int,
    rng: np.random.Generator,
) -> Interval | None:
    """median(runner-up) / median(leader), bootstrapped on the same time blocks of both."""
    if runner_up.n == 0 or leader.n == 0 or runner_up.units != leader.units:
        return None
    boot = block_speedup_intervals(
        runner_up,
        leader,
        statistics=(BEST_STATISTIC,),
        rng=rng,
        resamples=resamples,
        confidence=confidence,
    )
    shown = boot.intervals[BEST_STATISTIC].interval.to_dict()
    return {"estimate": shown["estimate"], "lower": shown["lower"], "upper": shown["upper"]}


def _separated(leader: Arm, samples: Mapping[Arm, ArmSample], alpha_each: float) -> list[Arm]:
    """The other treatments whose median the leader's is shown below, anytime-valid at
    `alpha_each`: the lower bound of median(other) / median(leader) above 1."""
    out: list[Arm] = []
    mine = samples[leader]
    for arm, sample in samples.items():
        if arm == leader or sample.n == 0 or mine.n == 0:
            continue
        lower, _upper = ratio_bounds(mine, sample, 0.5, alpha_each)
        if lower > 1.0:
            out.append(arm)
    return out
