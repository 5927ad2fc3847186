"""A two-sample anytime-valid test of "treatment P99 > (1 + tol) x control P99" (mirrored pairs).

Howard & Ramdas (2022, Sec. 5): at a candidate common quantile q, each arm's one-sided
beta-binomial mixture over its exceedances of q is an e-process; their product is one along the
interleaved arrivals, and "slower" is declared only when it reaches 1/alpha for EVERY q, which
implies it at the true quantile. Each arm's e-process is floored at w = 0.05 (still valid), so
states where one arm's evidence alone passes need not be listed. Swapping the arms tests
"faster". Assumes independent samples within an arm (pairs: positive dependence is covered);
the construction and its measured false-alarm rates: docs/statistics.md.
"""

from __future__ import annotations

import bisect
import functools
import math
from dataclasses import dataclass
from typing import Final, Literal

import numpy as np
import numpy.typing as npt

from specproxy.stats.anytime.sequential import (
    DEFAULT_TUNED_FOR_N,
    log_mixture_counts,
    mixture_strength,
)

__all__ = [
    "P99Decision",
    "P99TestResult",
    "p99_slower_test",
]

FloatArray = npt.NDArray[np.float64]
P99Decision = Literal["slower", "undecided"]
_P: Final = 0.99
# Each arm's e-process is (1 - w) * mixture + w * 1 (a mixture with the constant martingale 1, so
# still an e-process). It costs log(1 / (1 - w)) = 0.05 nats per arm, and it keeps every log
# e-value >= log w although the incomplete beta tails underflow to 0 far from the quantile.
_FLOOR_WEIGHT: Final = 0.05


@dataclass(frozen=True, slots=True)
class P99TestResult:
    """One look of the test.

    statistic: min over candidate quantiles q of log E_b(q) + log E_s(q) (natural log of the
    combined e-value, -inf with an empty arm), capped at the boundary (states past it are not
    evaluated); boundary: log(1/alpha). "slower" iff statistic >= boundary.
    samples_baseline / samples_speculative: how many of each arm it used.
    """

    statistic: float
    boundary: float
    decision: P99Decision
    samples_baseline: int
    samples_speculative: int


def _floored(log_m: FloatArray) -> FloatArray:
    """log((1 - w) M + w) for the mixture's log M."""
    out: FloatArray = np.logaddexp(math.log1p(-_FLOOR_WEIGHT) + log_m, math.log(_FLOOR_WEIGHT))
    return out


@functools.lru_cache(maxsize=4096)
def _spec_cap(n_s: int, need: float, rate: float, strength: float) -> int:
    """Smallest K_s whose speculative evidence alone reaches `need` (n_s + 1 if none does)."""

    def reaches(k: int) -> bool:  # increasing in k: the upper mixture grows with the count
        one = np.array([k], dtype=np.int64)
        return bool(_floored(log_mixture_counts(n_s, one, rate, strength, upper=True))[0] >= need)

    return bisect.bisect_left(range(n_s + 1), True, key=reaches)


@functools.lru_cache(maxsize=4096)
def _base_cap(n_b: int, need: float, rate: float, strength: float) -> int:
    """Largest K_b whose baseline evidence alone reaches `need` (-1 if none does)."""

    def reaches(k: int) -> bool:  # decreasing in k: the lower mixture falls with the count
        one = np.array([k], dtype=np.int64)
        return bool(_floored(log_mixture_counts(n_b, one, rate, strength, upper=False))[0] >= need)

    return bisect.bisect_left(range(n_b + 1), True, key=lambda k: not reaches(k)) - 1


def _statistic(
    n_b: int,
    n_s: int,
    kb: npt.NDArray[np.int64],
    ks: npt.NDArray[np.int64],
    alpha: float,
    cap: tuple[int, float],
) -> P99TestResult:
    """The test on the (K_b, K_s) states of every candidate q: min(min of the combined log
    e-value, boundary).

    States with K_s >= the speculative cap, or K_b <= the baseline cap, pass on one arm's
    evidence alone (its log e-value >= boundary - log w, the other's >= log w), so they are not
    evaluated: the minimum over the others, capped at the boundary, is exactly
    min(infimum over all states, boundary)."""
    boundary = math.log(1.0 / alpha)
    rate = 1.0 - _P
    limit, strength = cap
    need = boundary - math.log(_FLOOR_WEIGHT)
    keep = (ks < limit) & (kb > _base_cap(n_b, need, rate, strength))
    if not keep.any():  # every state passes on one arm's evidence alone
        return P99TestResult(boundary, boundary, "slower", n_b, n_s)
    key = np.unique(kb[keep] * (n_s + 1) + ks[keep])  # distinct states (histograms repeat them)
    log_eb = _floored(log_mixture_counts(n_b, key // (n_s + 1), rate, strength, upper=False))
    log_es = _floored(log_mixture_counts(n_s, key % (n_s + 1), rate, strength, upper=True))
    statistic = min(float(np.min(log_eb + log_es)), boundary)
    decision: P99Decision = "slower" if statistic >= boundary else "undecided"
    return P99TestResult(statistic, boundary, decision, n_b, n_s)


def _cap(n_s: int, alpha: float, tuned_for_n: int) -> tuple[int, float]:
    """(cap, mixture strength): states with K_s >= cap pass on the speculative evidence alone."""
    rate = 1.0 - _P  # the exceedance rate both mixtures test against
    strength = mixture_strength(rate, tuned_for_n)
    need = math.log(1.0 / alpha) - math.log(_FLOOR_WEIGHT)  # log E_b >= log w everywhere
    return _spec_cap(n_s, need, rate, strength), strength


def _check(alpha: float, tolerance: float) -> None:
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    if tolerance < 0.0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance}")


def p99_slower_test(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    tuned_for_n: int = DEFAULT_TUNED_FOR_N,
) -> P99TestResult:
    """Test "speculative P99 > (1 + tolerance) x baseline P99" on both arms' whole runs so far.

    Valid at level alpha simultaneously over all looks, provided each look sees the arms' samples
    in arrival order and later looks only append (a look is a prefix of the next one).
    Swapping the arguments tests the other direction: "baseline P99 > (1 + tolerance) x
    speculative P99", i.e. speculative P99 < baseline P99 / (1 + tolerance).
    """
    _check(alpha, tolerance)
    base = np.asarray(baseline, dtype=np.float64)
    spec = np.asarray(speculative, dtype=np.float64) / (1.0 + tolerance)
    n_b, n_s = int(base.size), int(spec.size)
    if n_b == 0 or n_s == 0:
        return P99TestResult(-math.inf, math.log(1.0 / alpha), "undecided", n_b, n_s)
    cap, strength = _cap(n_s, alpha, tuned_for_n)

    # Candidate q values: the top `cap` (scaled) speculative values and the baseline values
    # above the smallest of them. States with K_s >= cap always pass (see the module docstring).
    top_s = min(cap, n_s)
    spec_desc = -np.sort(-np.partition(spec, n_s - top_s)[n_s - top_s :]) if top_s else spec[:0]
    floor = float(spec_desc[top_s - 1]) if cap <= n_s else -math.inf
    base_hi = np.sort(base[base >= floor])[::-1]
    # Walk q downwards over the merged distinct values. At q = v: K_b counts base >= v and K_s
    # counts spec > v; just below v both count v.
    values = np.unique(np.concatenate([base_hi, spec_desc]))[::-1]
    kb_incl = np.searchsorted(-base_hi, -values, side="right")  # #base >= v
    ks_excl = np.searchsorted(-spec_desc, -values, side="left")  # #spec > v
    ks_incl = np.searchsorted(-spec_desc, -values, side="right")  # #spec >= v
    kb = np.concatenate([[0], kb_incl, kb_incl]).astype(np.int64)
    ks = np.concatenate([[0], ks_excl, ks_incl]).astype(np.int64)
    return _statistic(n_b, n_s, kb, ks, alpha, (cap, strength))
