"""Done-means simulations for the statistics engine (slow; run in CI).

Figures are printed (`pytest -s -m slow tests/stats/test_simulations.py`). Coverage runs use 999
resamples instead of 2000 to stay within the CI budget; the mean uses fewer replications because
each needs a full index resample (Monte-Carlo SE printed with every figure).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.stats.anytime.sequential import compare_sequential, count_boundaries
from specproxy.stats.estimate.adjust import adjusted_speedup
from specproxy.stats.estimate.bootstrap import split_speedup_intervals

pytestmark = pytest.mark.slow
FloatArray = npt.NDArray[np.float64]
Draw = Callable[[np.random.Generator, int], FloatArray]

DISTRIBUTIONS: dict[str, Draw] = {
    "lognormal": lambda rng, n: rng.lognormal(0.0, 0.5, n),
    # lognormal body times a Pareto(3) tail: finite variance, very heavy P99
    "heavy": lambda rng, n: rng.lognormal(0.0, 0.3, n) * (1.0 + rng.pareto(3.0, n)),
}
TRUE_SPEEDUP = 1.25  # speculative = baseline / 1.25 in distribution, so every ratio is 1.25


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
@pytest.mark.parametrize(
    ("statistic", "n", "runs"),
    [("median", 2000, 1000), ("p90", 2000, 1000), ("p99", 10_000, 1000), ("mean", 2000, 400)],
)
def test_ci_coverage(dist: str, statistic: str, n: int, runs: int) -> None:
    draw = DISTRIBUTIONS[dist]
    rng = np.random.default_rng(20240601)
    hits = 0
    for _ in range(runs):
        base, spec = draw(rng, n), draw(rng, n) / TRUE_SPEEDUP
        ci = split_speedup_intervals(base, spec, statistics=[statistic], rng=rng, resamples=999)[
            statistic
        ]
        hits += ci.lower <= TRUE_SPEEDUP <= ci.upper
    coverage = hits / runs
    se = math.sqrt(0.95 * 0.05 / runs)
    print(f"\ncoverage {dist} {statistic} n={n}: {coverage:.3f} (runs={runs}, MC se {se:.3f})")
    assert 0.93 <= coverage <= 0.97


def _p99_sequential(
    rng: np.random.Generator,
    runs: int,
    ratio: float,
    sigma: float,
    tolerance: float,
    max_n: int,
    alpha: float = 0.05,
    every: int = 100,
    keep: int = 600,
) -> FloatArray:
    """Fraction of runs whose P99-slowdown test has rejected by each look (exact order stats).

    Only the top `keep` values of each arm are needed for ranks near P99, so the runs are
    vectorised with a sorted top-k buffer per arm.
    """
    top_b = np.empty((runs, 0))
    top_s = np.empty((runs, 0))
    rejected = np.zeros(runs, dtype=bool)
    curve = []
    for t in range(every, max_n + 1, every):
        top_b = np.sort(np.concatenate([top_b, rng.lognormal(0, sigma, (runs, every))], 1), 1)
        top_s = np.sort(
            np.concatenate([top_s, rng.lognormal(math.log(ratio), sigma, (runs, every))], 1), 1
        )
        top_b, top_s = top_b[:, -keep:], top_s[:, -keep:]
        k_lo, k_hi = count_boundaries(t, 0.99, alpha / 2)
        if k_lo >= 1 and k_hi <= t:
            assert t - k_lo < keep
            lower_spec = top_s[:, -(t - k_lo + 1)]
            upper_base = top_b[:, -(t - k_hi + 1)]
            rejected |= lower_spec > (1.0 + tolerance) * upper_base
        curve.append(rejected.mean())
    return np.array(curve)


def test_sequential_sim_matches_the_production_test() -> None:
    rng = np.random.default_rng(5)
    base, spec = rng.lognormal(0, 0.2, 3000), rng.lognormal(math.log(1.15), 0.2, 3000)
    res = compare_sequential(base, spec, alpha=0.05, tolerance=0.0)
    k_lo, k_hi = count_boundaries(3000, 0.99, 0.025)
    assert res.p99_ratio_lower == pytest.approx(np.sort(spec)[k_lo - 1] / np.sort(base)[k_hi - 1])


def test_sequential_false_alarm_rate_under_identical_arms() -> None:
    runs, alpha = 500, 0.05
    curve = _p99_sequential(np.random.default_rng(7), runs, 1.0, 0.5, 0.0, 20_000, alpha)
    se = math.sqrt(alpha * (1 - alpha) / runs)
    print(f"\nP99 false alarms, 500 runs, look every 100 up to 20k: {curve[-1]:.3f} (se {se:.3f})")
    assert curve[-1] <= alpha + 2 * se


def test_sequential_median_false_alarm_rate() -> None:
    runs, alpha, every = 500, 0.05, 500
    rng = np.random.default_rng(8)
    base, spec = rng.lognormal(0, 0.5, (runs, 20_000)), rng.lognormal(0, 0.5, (runs, 20_000))
    alarm = np.zeros(runs, dtype=bool)
    for t in range(every, 20_001, every):
        k_lo, k_hi = count_boundaries(t, 0.5, alpha / 2)
        if k_lo < 1 or k_hi > t:
            continue
        b = np.partition(base[:, :t], [k_lo - 1, k_hi - 1], axis=1)
        s = np.partition(spec[:, :t], [k_lo - 1, k_hi - 1], axis=1)
        faster = s[:, k_hi - 1] < b[:, k_lo - 1]
        slower = s[:, k_lo - 1] > b[:, k_hi - 1]
        alarm |= faster | slower
    se = math.sqrt(2 * alpha * (1 - 2 * alpha) / runs)
    print(f"\nmedian faster-or-slower false alarms (look every 500 to 20k): {alarm.mean():.3f}")
    assert alarm.mean() <= 2 * alpha + 2 * se  # two one-sided claims, each at level alpha


def test_sequential_detects_a_10_percent_p99_slowdown_by_5k() -> None:
    # TPOT-like spread (lognormal sigma 0.2); the power depends on the tail's spread, see report
    curve = _p99_sequential(np.random.default_rng(9), 500, 1.10, 0.2, 0.0, 5000)
    print(f"\npower for a 10% P99 slowdown by 5k/arm (sigma 0.2, tol 0): {curve[-1]:.3f}")
    assert curve[-1] >= 0.8


def test_adjusted_ci_is_at_most_half_as_wide() -> None:
    rng = np.random.default_rng(10)
    runs, n, speedup = 100, 1000, 1.5
    ratios_median, ratios_mean, hits = [], [], 0
    for _ in range(runs):
        tokens = [np.exp(rng.uniform(np.log(20), np.log(200), n)) for _ in range(2)]  # 10x
        prompt = [rng.integers(10, 500, n).astype(float) for _ in range(2)]
        tpot_b = rng.lognormal(np.log(0.02), 0.25, n)
        tpot_s = rng.lognormal(np.log(0.02 / speedup), 0.25, n)
        e2e_b, e2e_s = tokens[0] * tpot_b, tokens[1] * tpot_s
        adj = adjusted_speedup(
            e2e_b,
            tokens[0],
            e2e_s,
            tokens[1],
            baseline_prompt_tokens=prompt[0],
            speculative_prompt_tokens=prompt[1],
        )
        assert adj is not None
        hits += adj.lower <= speedup <= adj.upper
        plain = split_speedup_intervals(
            e2e_b, e2e_s, statistics=["median", "mean"], rng=rng, resamples=999
        )
        width = math.log(adj.upper / adj.lower)
        ratios_median.append(width / math.log(plain["median"].upper / plain["median"].lower))
        ratios_mean.append(width / math.log(plain["mean"].upper / plain["mean"].lower))
    med, mean = float(np.median(ratios_median)), float(np.median(ratios_mean))
    print(
        f"\nadjusted/unadjusted CI width (log scale), 10x output spread, n={n}/arm: "
        f"vs median {med:.2f}, vs mean {mean:.2f}; adjusted coverage {hits / runs:.2f}"
    )
    assert max(ratios_median) <= 0.5 and max(ratios_mean) <= 0.5
    assert hits / runs >= 0.88
