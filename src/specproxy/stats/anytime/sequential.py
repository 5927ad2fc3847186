"""Confidence sequences for a quantile of one arm, and for the ratio of two arms' quantiles.

Howard & Ramdas (2022, Bernoulli 28(3), Sec. 2): for continuous latencies the indicators
1{X_i <= q*} are i.i.d. Bernoulli(p), so a time-uniform boundary on their count turns into
order-statistic bounds on q*. The count boundaries are one-sided conjugate beta-binomial mixture
martingales (Robbins 1970; Howard et al. 2021, Ann. Statist. 49(2), Sec. 3) with Ville's
inequality; the prior strength r = tuned_for_n / 9 makes them tightest near `tuned_for_n`
samples (validity does not depend on it). Two arms: each arm's sequence at alpha / 2 (a union
bound), each indexed by its own count. On histograms the order statistics are bin centres.
"""

from __future__ import annotations

import functools
import math
from typing import Final

import numpy as np
import numpy.typing as npt
import scipy.special as sp

from specproxy.stats.sample import ArmSample

__all__ = [
    "DEFAULT_TUNED_FOR_N",
    "count_boundaries",
    "cs_bounds",
    "log_mixture_counts",
    "mixture_strength",
    "ratio_bounds",
]

FloatArray = npt.NDArray[np.float64]
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


def cs_bounds(sample: ArmSample, p: float, alpha: float, tuned_for_n: int) -> tuple[float, float]:
    """Time-uniform level-alpha bounds (lower, upper) on the p-quantile of the sample's law:
    order statistics at the ranks of `count_boundaries` (-inf / inf: no bound yet)."""
    k_lo, k_hi = count_boundaries(sample.n, p, alpha, tuned_for_n)
    lower = sample.order_statistic(k_lo) if 1 <= k_lo <= sample.n else -math.inf
    upper = sample.order_statistic(k_hi) if 1 <= k_hi <= sample.n else math.inf
    return lower, upper


def ratio_bounds(
    control: ArmSample,
    treatment: ArmSample,
    p: float,
    alpha: float,
    tuned_for_n: int = DEFAULT_TUNED_FOR_N,
) -> tuple[float, float]:
    """Time-uniform bounds on Q_treatment(p) / Q_control(p) at level alpha: each arm's CS at
    alpha / 2 (a union bound). (0, inf) while an arm has no bound yet."""
    c_lo, c_hi = cs_bounds(control, p, alpha / 2, tuned_for_n)
    t_lo, t_hi = cs_bounds(treatment, p, alpha / 2, tuned_for_n)
    lower = t_lo / c_hi if math.isfinite(c_hi) and c_hi > 0 and t_lo > 0 else 0.0
    upper = t_hi / c_lo if c_lo > 0 and math.isfinite(t_hi) else math.inf
    return lower, upper
