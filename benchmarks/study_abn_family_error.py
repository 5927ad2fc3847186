"""A/A/A...: the family-wise rate of false "faster"/"slower" verdicts over m treatments that are
all the control in law, with sequential looks, through the production tests.

Each run draws a control and m treatments (lognormal latencies, sd 0.5 in log, 2 requests per
second per arm), looks every `look_s` seconds up to `looks` looks, and at each look computes
every treatment's E2E evidence against the control (`anytime.verdict.evidence`: the median's
and P99's confidence sequences and the per-minute exceedance e-process) at the Bonferroni level
alpha / m, folded through the job's `DecisionMemory` (the whole run: bounds intersected over
looks, as the live job does). A run is a false discovery when any treatment's verdict is ever
not "inconclusive". The rule holds the family at alpha whatever the dependence between the
comparisons (they share one control); the Bonferroni bound is conservative, so the measured rate
sits well below alpha.

    nice -n 10 .venv/bin/python -m benchmarks.study_abn_family_error --runs 500 --treatments 3

prints the rate with its exact one-sided 95 % upper bound (Clopper-Pearson).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
from scipy.stats import beta

from specproxy.stats.anytime.decision import DecisionMemory
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.sample import ArmSample

__all__ = ["false_verdict_run", "family_error", "main", "upper_bound"]

RATE_PER_S = 2.0  # requests per second per arm
UNIT_S = 60.0  # the rollups' minute: the exceedance test needs minute units


def _sample(rng: np.random.Generator, seconds: float) -> tuple[np.ndarray, np.ndarray]:
    n = rng.poisson(RATE_PER_S * seconds)
    t = np.sort(rng.uniform(0.0, seconds, n))
    return rng.lognormal(0.0, 0.5, n), t


def false_verdict_run(
    rng: np.random.Generator,
    *,
    treatments: int,
    looks: int,
    look_s: float,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    speedup: float = 1.0,
) -> bool:
    """One A/A/A run: whether any treatment got a faster/slower E2E verdict at any look
    (`speedup` != 1: the first treatment is that much faster, a check of the tests' power)."""
    total = looks * look_s
    arms = [_sample(rng, total) for _ in range(treatments + 1)]
    arms[1] = (arms[1][0] / speedup, arms[1][1])
    memory = DecisionMemory()
    level = alpha / treatments
    for look in range(1, looks + 1):
        end = look * look_s
        units = int(np.ceil(end / UNIT_S))
        window = []
        for values, t in arms:
            keep = t < end
            unit = np.floor(t[keep] / UNIT_S).astype(np.int64)
            window.append(ArmSample.from_values(values[keep], unit, units, UNIT_S))
        control, *others = window
        for i, treatment in enumerate(others):
            now = evidence(control, treatment, alpha=level, tolerance=tolerance)
            decision = memory.recall(("all", "all", f"e2e@{i}"), now, at=end, span_s=None)
            if decision.verdict != "inconclusive":
                return True
    return False


def family_error(
    runs: int, *, treatments: int, looks: int, look_s: float, seed: int = 0
) -> tuple[int, int]:
    """(false discoveries, runs)."""
    rng = np.random.default_rng(seed)
    hits = sum(
        false_verdict_run(rng, treatments=treatments, looks=looks, look_s=look_s)
        for _ in range(runs)
    )
    return hits, runs


def upper_bound(hits: int, runs: int, confidence: float = 0.95) -> float:
    """Clopper-Pearson one-sided upper bound of a binomial rate."""
    return 1.0 if hits == runs else float(beta.ppf(confidence, hits + 1, runs - hits))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--treatments", type=int, default=3)
    parser.add_argument("--looks", type=int, default=10)
    parser.add_argument("--look-s", type=float, default=300.0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    hits, runs = family_error(
        args.runs,
        treatments=args.treatments,
        looks=args.looks,
        look_s=args.look_s,
        seed=args.seed,
    )
    print(
        f"A/A/A family-wise false-verdict rate, m={args.treatments} treatments, {args.looks} looks"
        f" every {args.look_s:g} s ({RATE_PER_S:g} req/s per arm), alpha=0.05 (alpha/m each):"
        f" {hits}/{runs} = {hits / runs:.4f},"
        f" one-sided 95% upper bound {upper_bound(hits, runs):.4f}"
    )


if __name__ == "__main__":
    main()
