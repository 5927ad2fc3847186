"""Anytime-valid tests of "speculative P99 is slower" and "speculative median is faster/slower".

Dashboards are read every few seconds, so a fixed-horizon test would raise false alarms; these
tests stay valid however often they are looked at and whenever the looking stops.

What is implemented (and why it is valid):

1. A confidence sequence (CS) for one quantile q* = Q(p) of one arm, built as in Howard & Ramdas
   (2022), "Sequential estimation of quantiles with applications to A/B-testing and best-arm
   identification", Bernoulli 28(3), Sec. 2 (Theorem 1's construction): for continuous latencies
   the indicators 1{X_i <= q*} are i.i.d. Bernoulli(p), so a time-uniform boundary for the count
   S_t = #{i <= t: X_i <= q*} turns into order-statistic bounds: if S_t(q*) < k_hi(t) for all t
   then q* < x_(k_hi(t)) for all t, and symmetrically for k_lo(t).
2. The count boundaries come from one-sided *conjugate beta-binomial mixture* martingales
   (Robbins 1970; Howard, Ramdas, McAuliffe & Sekhon 2021, "Time-uniform, nonparametric,
   nonasymptotic confidence sequences", Ann. Statist. 49(2), Sec. 3): with a Beta(p*r, (1-p)*r)
   prior truncated to theta > p,
       M_t(s) = E_theta[(theta/p)^s ((1-theta)/(1-p))^(t-s)]
   is a nonnegative martingale with M_0 = 1 under theta = p (a supermartingale when theta < p),
   so by Ville's inequality P(exists t: M_t(S_t) >= 1/a) <= a. k_hi(t) is the smallest s with
   M_t(s) >= 1/a (the mirror-image mixture over theta < p gives k_lo). The prior strength
   r = tuned_for_n / 9 makes the boundary tightest near `tuned_for_n` samples; validity does not
   depend on it.
3. Two arms are compared by a union bound: each arm's CS is run at level alpha/2, so with
   probability >= 1 - alpha both hold at all times, and "speculative P99 > baseline P99 x (1+tol)"
   is declared only when lower_spec > (1+tol) x upper_base. Each arm is indexed by its own sample
   count, so unequal arrival rates are fine. The P99 ratio is run at a level of its own
   (`p99_alpha`; the stats job passes alpha/2: the exceedance test of `exceedance` on split
   traffic, or the two-sample test of `p99test` on mirrored pairs, spends the other half, see
   `decide`).
4. `decide` is the one rule that turns the bounds and the two-sample test's rejections into the
   verdict (`stats.verdict` computes, `stats.hysteresis` re-decides on the whole run).

The CS depends on the data only through the current order statistics, so evaluating it on the
whole run at every job tick is exactly "continuous monitoring". On a sliding window it is a valid
fixed-sample statement at each tick, but not a sequence over ticks.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import scipy.special as sp

from specproxy.stats import result as schema
from specproxy.stats.result import Verdict

__all__ = [
    "DEFAULT_TUNED_FOR_N",
    "Decision",
    "RankedArm",
    "SequentialResult",
    "Verdict",
    "compare_sequential",
    "compare_sequential_ranked",
    "count_boundaries",
    "decide",
    "log_mixture_counts",
    "mixture_strength",
    "quantile_confidence_sequence",
]

FloatArray = npt.NDArray[np.float64]
# Verdict is declared in `stats.result` and re-exported here.
DEFAULT_TUNED_FOR_N: Final = 5000


def mixture_strength(p: float, tuned_for_n: int) -> float:
    """Prior strength r of the beta-binomial mixture, tightest near `tuned_for_n` samples."""
    return max(tuned_for_n / 9.0, 2.0 / min(p, 1.0 - p))


def log_mixture_counts(
    t: int, s: npt.NDArray[np.int64], p: float, strength: float, upper: bool
) -> FloatArray:
    """log M_t(s) of the truncated beta-binomial mixture (upper: prior on theta > p), for an
    array of success counts s out of t trials."""
    a, b = p * strength, (1.0 - p) * strength
    sf = s.astype(np.float64)
    f = t - sf
    tail = sp.betaincc if upper else sp.betainc
    with np.errstate(divide="ignore"):
        num = sp.betaln(a + sf, b + f) + np.log(tail(a + sf, b + f, p))
        den = sp.betaln(a, b) + np.log(tail(a, b, p))
    out: FloatArray = num - den - sf * math.log(p) - f * math.log1p(-p)
    return out


def _log_mixture(t: int, s: int, p: float, strength: float, upper: bool) -> float:
    """log M_t(s) for one count."""
    return float(log_mixture_counts(t, np.array([s], dtype=np.int64), p, strength, upper)[0])


@functools.lru_cache(maxsize=65536)
def count_boundaries(
    t: int, p: float, alpha: float, tuned_for_n: int = DEFAULT_TUNED_FOR_N
) -> tuple[int, int]:
    """(k_lo, k_hi): 1-based order-statistic ranks of a level-alpha CS for the p-quantile.

    k_lo = 0 means no lower bound yet (-inf); k_hi = t + 1 means no upper bound yet (+inf).
    """
    if t <= 0:
        return 0, t + 1
    strength = mixture_strength(p, tuned_for_n)
    threshold = math.log(1.0 / alpha)

    def rejects_high(s: int) -> bool:  # increasing in s
        return _log_mixture(t, s, p, strength, upper=True) >= threshold

    def rejects_low(s: int) -> bool:  # decreasing in s
        return _log_mixture(t, s, p, strength, upper=False) >= threshold

    k_hi = t + 1
    if rejects_high(t):
        lo, hi = 0, t  # smallest s in [0, t] that rejects
        while lo < hi:
            mid = (lo + hi) // 2
            if rejects_high(mid):
                hi = mid
            else:
                lo = mid + 1
        k_hi = lo
    k_lo = 0
    if rejects_low(0):
        lo, hi = 0, t  # largest s in [0, t] that rejects
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if rejects_low(mid):
                lo = mid
            else:
                hi = mid - 1
        k_lo = lo
    return k_lo, max(k_hi, 1)


def quantile_confidence_sequence(
    values: FloatArray, p: float, alpha: float, tuned_for_n: int = DEFAULT_TUNED_FOR_N
) -> tuple[float, float]:
    """Time-uniform level-alpha bounds (lower, upper) on the p-quantile of `values`' law."""
    t = int(values.size)
    k_lo, k_hi = count_boundaries(t, p, alpha, tuned_for_n)
    ranks = [k for k in (k_lo, k_hi) if 1 <= k <= t]
    picked = np.partition(values, [k - 1 for k in ranks]) if ranks else values
    lower = float(picked[k_lo - 1]) if 1 <= k_lo <= t else -math.inf
    upper = float(picked[k_hi - 1]) if 1 <= k_hi <= t else math.inf
    return lower, upper


@dataclass(frozen=True, slots=True)
class Decision:
    """Which anytime-valid tests reject, and the verdicts that follow (the rule of `decide`)."""

    p99_union_slower: bool
    p99_union_faster: bool
    p99_two_sample_slower: bool
    p99_two_sample_faster: bool
    median_slower: bool
    median_faster: bool
    p99_exceedance_slower: bool = False
    p99_exceedance_faster: bool = False

    @property
    def p99_slower_evidence(self) -> bool:
        return self.p99_union_slower or self.p99_two_sample_slower or self.p99_exceedance_slower

    @property
    def p99_faster_evidence(self) -> bool:
        return self.p99_union_faster or self.p99_two_sample_faster or self.p99_exceedance_faster

    @property
    def p99_conflict(self) -> bool:
        """Both directions rejected: under the model one of the tests erred."""
        return self.p99_slower_evidence and self.p99_faster_evidence

    @property
    def p99_verdict(self) -> Verdict:
        if self.p99_conflict:
            return "inconclusive"
        if self.p99_slower_evidence:
            return "slower"
        return "faster" if self.p99_faster_evidence else "inconclusive"

    @property
    def p99_decided_by(self) -> list[str]:
        """The P99 tests that rejected in the direction of the P99 verdict."""
        v = self.p99_verdict
        if v == "inconclusive":
            return []
        hits = (
            (self.p99_union_slower, self.p99_two_sample_slower, self.p99_exceedance_slower)
            if v == "slower"
            else (self.p99_union_faster, self.p99_two_sample_faster, self.p99_exceedance_faster)
        )
        names = ("union_bound", "two_sample", "exceedance")
        return [name for name, hit in zip(names, hits, strict=True) if hit]

    @property
    def median_verdict(self) -> Verdict:
        if self.median_slower:
            return "slower"
        return "faster" if self.median_faster else "inconclusive"

    @property
    def verdict(self) -> Verdict:
        """slower if the P99 or the median verdict is slower (a slower tail is never outweighed
        by a faster median), else faster if either is faster, else inconclusive."""
        both = (self.p99_verdict, self.median_verdict)
        if "slower" in both:
            return "slower"
        return "faster" if "faster" in both else "inconclusive"

    @property
    def decided_by(self) -> list[str]:
        """The tests behind `verdict`: "p99_union_bound", "p99_two_sample", "p99_exceedance",
        "median"."""
        v = self.verdict
        out = [f"p99_{name}" for name in self.p99_decided_by] if self.p99_verdict == v else []
        return [*out, "median"] if v != "inconclusive" and self.median_verdict == v else out


def decide(
    p99_ratio_lower: float,
    p99_ratio_upper: float,
    median_ratio_lower: float,
    median_ratio_upper: float,
    *,
    tolerance: float,
    two_sample_slower: bool = False,
    two_sample_faster: bool = False,
    exceedance_slower: bool = False,
    exceedance_faster: bool = False,
) -> Decision:
    """The verdict rule, in one place.

    P99, c = 1 + tolerance. Two tests per direction, each at level alpha / 2, so that each
    direction's error is <= alpha however often it is looked at (a union bound over the tests):
      * the union bound of per-arm CSs (ratio bounds at level alpha / 2): slower if the lower
        bound > c, faster if the upper bound < 1 / c;
      * on split traffic, the per-minute exceedance e-process of `exceedance` at alpha / 2
        (`exceedance_*`), whose level holds under serial dependence across minutes; on mirrored
        pairs (no random assignment within a minute) the two-sample e-process of `p99test` at
        alpha / 2 (`two_sample_*`) instead. Either rejects when it crosses log(2 / alpha);
        faster is the same test with the arms' roles swapped. Which one a design runs is fixed
        by the design, never by the data (`stats.verdict`).
    The P99 verdict is slower if a slower test rejects and no faster test does, faster
    symmetrically, else inconclusive (a conflict needs an error of one of the tests, so neither
    claim is made). The median (CS at level alpha): faster if the upper bound < 1, slower if the
    lower bound > 1. The metric's verdict is `Decision.verdict`.
    """
    c = 1.0 + tolerance
    return Decision(
        p99_union_slower=p99_ratio_lower > c,
        p99_union_faster=p99_ratio_upper < 1.0 / c,
        p99_two_sample_slower=two_sample_slower,
        p99_two_sample_faster=two_sample_faster,
        median_slower=median_ratio_lower > 1.0,
        median_faster=median_ratio_upper < 1.0,
        p99_exceedance_slower=exceedance_slower,
        p99_exceedance_faster=exceedance_faster,
    )


@dataclass(frozen=True, slots=True)
class SequentialResult:
    """Anytime-valid statements about speculative/baseline ratios for one metric.

    Ratio bounds are spec/base (> 1 means speculative is slower) and hold simultaneously, at all
    times, with probability >= 1 - alpha per quantile.
    """

    p99_ratio_lower: float
    p99_ratio_upper: float
    median_ratio_lower: float
    median_ratio_upper: float
    tolerance: float

    @property
    def decision(self) -> Decision:
        """The rule of `decide` on these bounds alone (no two-sample test)."""
        return decide(
            self.p99_ratio_lower,
            self.p99_ratio_upper,
            self.median_ratio_lower,
            self.median_ratio_upper,
            tolerance=self.tolerance,
        )

    @property
    def p99_slower(self) -> bool:  # spec P99 > base P99 * (1 + tolerance)
        return self.decision.p99_union_slower

    @property
    def median_faster(self) -> bool:  # spec median < base median
        return self.decision.median_faster

    @property
    def median_slower(self) -> bool:  # spec median > base median
        return self.decision.median_slower

    @property
    def verdict(self) -> Verdict:
        return self.decision.verdict

    def to_dict(self) -> schema.Sequential:
        def finite(x: float) -> float | None:
            return x if math.isfinite(x) else None

        return {
            "p99_ratio_lower": finite(self.p99_ratio_lower),
            "p99_ratio_upper": finite(self.p99_ratio_upper),
            "median_ratio_lower": finite(self.median_ratio_lower),
            "median_ratio_upper": finite(self.median_ratio_upper),
            "p99_slower": self.p99_slower,
            "median_faster": self.median_faster,
            "median_slower": self.median_slower,
            "verdict": self.verdict,
            "hysteresis": None,  # set by `stats.hysteresis` on the whole-run window
            "hysteresis_ticks": 0,
            "decided_by": self.decision.decided_by,
        }


OrderStatistic = Callable[[int], float]  # 1-based rank -> value


@dataclass(frozen=True, slots=True)
class RankedArm:
    """An arm seen only through its size and its order statistics (raw values or a histogram)."""

    n: int
    order_statistic: OrderStatistic

    @classmethod
    def of_values(cls, values: FloatArray) -> RankedArm:
        ordered = np.sort(values)
        return cls(int(ordered.size), lambda k: float(ordered[k - 1]))

    @classmethod
    def of_histogram(cls, values_of_bins: FloatArray, counts: npt.NDArray[np.int64]) -> RankedArm:
        """Bins in increasing order, each represented by one value (its centre): order statistics
        are then within half a bin of the exact ones (`loggrid.GRID_ERROR_BOUND`)."""
        cum = np.cumsum(counts)
        return cls(
            int(cum[-1]) if cum.size else 0,
            lambda k: float(values_of_bins[int(np.searchsorted(cum, k, side="left"))]),
        )


def _cs(arm: RankedArm, p: float, alpha: float, tuned_for_n: int) -> tuple[float, float]:
    k_lo, k_hi = count_boundaries(arm.n, p, alpha, tuned_for_n)
    lower = arm.order_statistic(k_lo) if 1 <= k_lo <= arm.n else -math.inf
    upper = arm.order_statistic(k_hi) if 1 <= k_hi <= arm.n else math.inf
    return lower, upper


def _ratio_bounds(
    baseline: RankedArm, speculative: RankedArm, p: float, alpha: float, tuned_for_n: int
) -> tuple[float, float]:
    """Time-uniform bounds on Q_spec(p) / Q_base(p), each arm's CS at alpha / 2."""
    b_lo, b_hi = _cs(baseline, p, alpha / 2, tuned_for_n)
    s_lo, s_hi = _cs(speculative, p, alpha / 2, tuned_for_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        lower = s_lo / b_hi if math.isfinite(b_hi) and b_hi > 0 and s_lo > 0 else 0.0
        upper = s_hi / b_lo if b_lo > 0 and math.isfinite(s_hi) else math.inf
    return lower, upper


def compare_sequential(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    tuned_for_n: int = DEFAULT_TUNED_FOR_N,
    p99_alpha: float | None = None,
) -> SequentialResult:
    """Run the P99-slowdown and median tests on positive latencies of both arms."""
    return compare_sequential_ranked(
        RankedArm.of_values(baseline),
        RankedArm.of_values(speculative),
        alpha=alpha,
        tolerance=tolerance,
        tuned_for_n=tuned_for_n,
        p99_alpha=p99_alpha,
    )


def compare_sequential_ranked(
    baseline: RankedArm,
    speculative: RankedArm,
    *,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    tuned_for_n: int = DEFAULT_TUNED_FOR_N,
    p99_alpha: float | None = None,
) -> SequentialResult:
    """`compare_sequential` for arms given by their order statistics (e.g. rollup histograms).
    The P99 ratio bounds are at level `p99_alpha` (default: alpha)."""
    p99_level = alpha if p99_alpha is None else p99_alpha
    p99_lo, p99_hi = _ratio_bounds(baseline, speculative, 0.99, p99_level, tuned_for_n)
    med_lo, med_hi = _ratio_bounds(baseline, speculative, 0.5, alpha, tuned_for_n)
    return SequentialResult(
        p99_ratio_lower=p99_lo,
        p99_ratio_upper=p99_hi,
        median_ratio_lower=med_lo,
        median_ratio_upper=med_hi,
        tolerance=tolerance,
    )
