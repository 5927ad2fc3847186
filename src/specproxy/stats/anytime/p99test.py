"""A two-sample anytime-valid test of "speculative P99 > (1 + tol) x baseline P99".

Why not the union bound of `stats.sequential`: it declares "slower" only when the speculative
arm's lower P99 bound (level alpha/2) clears the baseline's upper bound (level alpha/2), so each arm
alone must reach log(2/alpha) of evidence at the crossing point. Here the two arms' evidence is
*multiplied* at every candidate common quantile, so together they need only log(1/alpha): at
equal arm sizes the P99 gap must be about 4 standard errors instead of about 6.

Construction (Howard & Ramdas 2022, Bernoulli 28(3), Sec. 5, two-sample quantile tests; the
one-sided beta-binomial mixtures of Howard et al. 2021, Ann. Statist. 49(2), Sec. 3):

- Null H0: Q_s(p) <= c * Q_b(p), c = 1 + tol, p = 0.99. Let q* = Q_b(p).
- Baseline: K_b(q) = #{i <= n_b: X_b,i >= q}. At q = q*, P(X_b >= q*) >= 1 - p, so the mixture
  over exceedance rates theta < 1 - p (`upper=False`) is a nonnegative supermartingale with
  initial value 1: E_b(q*).
- Speculative: K_s(q) = #{j <= n_s: X_s,j > c q}. Under H0, P(X_s > c q*) <= 1 - p, so the
  mixture over theta > 1 - p (`upper=True`) is a nonnegative supermartingale: E_s(q*).
- The arms are independent and each arrival adds one sample to one arm (which arm is not decided
  by the value about to arrive), so E_b(q*) * E_s(q*) is a nonnegative supermartingale along the
  interleaved arrival sequence; Ville: P(exists a look with E_b(q*) E_s(q*) >= 1/alpha) <= alpha.
- q* is unknown, so "slower" is declared only when log E_b(q) + log E_s(q) >= log(1/alpha) for
  EVERY q; that implies it at q*, so the level holds at every look and every stopping rule.

Each arm's e-process is floored: (1 - w) x mixture + w (w = 0.05, still an e-process; it costs
0.05 nats per arm). The infimum over q runs over the finitely many (K_b, K_s) states that q can
produce, and states with a large K_s need not be listed: log E_b >= log w everywhere, so once
log E_s(K_s) >= log(1/alpha) - log w the state cannot block a rejection. Only the top `cap`
speculative values and the baseline values above them are visited.

The faster direction ("speculative P99 < baseline P99 / c") is the same test with the arms'
roles swapped. `p99_slower_test_binned` runs it on histograms (rollups) with a statistic that is
never above the exact one for any values the bins could hold (its docstring says how).

Assumptions (the same as `stats.sequential`): samples within an arm are independent, arms are
independent of each other (mirrored pairs: see `stats.verdict`). Serial correlation and load
waves are NOT covered by the proof (the time-block structure is not used here); they are
measured instead: A/A, a look every 100 samples to 3000 per arm, 500 runs each, the wired
verdict (tests/stats/test_verdict.py, benchmarks/bench_p99power.py) made 0 false claims with
AR(1) rho 0.3 on log latency and with load waves scaling both arms at tolerance 0.05, and 1 of
500 (0.002) with AR(1) at tolerance 0.
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
