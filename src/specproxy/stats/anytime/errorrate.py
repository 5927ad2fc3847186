"""An anytime-valid one-sided test that a treatment's error rate is higher than the control's.

Per time unit b the two arms served n_t and n_c requests and returned k_t and k_c errors. Under
the null (in each unit, both arms have the same error probability, whatever it is and however it
drifts), given the unit's totals the treatment's share K of the unit's E = k_t + k_c errors is
hypergeometric (n_t + n_c, n_t, E); its moment generating function is at most the binomial
(E, pi = n_t / (n_t + n_c)) one (Hoeffding 1963, Thm. 4). So for an odds ratio theta > 1,

    L_b(theta) = exp(log(theta) K - E log(1 - pi + pi theta))

has conditional expectation <= 1, the product over units is a nonnegative supermartingale, and
an equal-weight mixture over a grid of odds ratios is an e-process (it is the likelihood ratio of
"the treatment's error odds are theta times the control's" against the null, when the arms are
Bernoulli-randomized). Ville's inequality: it ever reaches 1/alpha with probability <= alpha, at
any number of looks and however the treatment's share changes between units (the ramp changes
it; only units with both arms and an error count). Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = [
    "ODDS_RATIOS",
    "ErrorRatePath",
    "ErrorRateTest",
    "UnitErrors",
    "error_rate_path",
    "error_rate_test",
]

ODDS_RATIOS: Final[tuple[float, ...]] = (1.25, 1.5, 2.0, 3.0, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class UnitErrors:
    """One time unit's requests and errors per arm (primary requests, rerouted ones excluded)."""

    control_requests: int
    control_errors: int
    treatment_requests: int
    treatment_errors: int

    def __post_init__(self) -> None:
        for n, k in (
            (self.control_requests, self.control_errors),
            (self.treatment_requests, self.treatment_errors),
        ):
            if n < 0 or not 0 <= k <= n:
                raise ValueError("errors must lie in 0..requests")


@dataclass(frozen=True, slots=True)
class ErrorRateTest:
    """The test at one look: `log_e` the mixture's log e-value, `rejected` when it reached
    log(1/alpha); the arms' pooled rates are for the reasons only."""

    log_e: float
    boundary: float
    rejected: bool
    control_rate: float | None
    treatment_rate: float | None


@dataclass(frozen=True, slots=True)
class ErrorRatePath:
    """The e-process over a prefix of units: each odds ratio's log product, the mixture's log
    e-value at the last unit with errors, whether it reached the boundary at any unit, and the
    arms' totals (control requests, errors, treatment requests, errors). A caller that keeps it
    feeds later units alone and gets the test of feeding every unit again."""

    logs: tuple[float, ...] = (0.0,) * len(ODDS_RATIOS)
    log_e: float = 0.0
    rejected: bool = False
    totals: tuple[int, int, int, int] = (0, 0, 0, 0)


def error_rate_test(
    units: Iterable[UnitErrors],
    *,
    alpha: float,
    odds_ratios: Sequence[float] = ODDS_RATIOS,
    start: ErrorRatePath | None = None,
) -> ErrorRateTest:
    """The e-process over `units` in time order (rejected if it crossed at any prefix: the
    caller may hold a crossing across ticks as well); `start`: the path over earlier units, at
    the same alpha and odds ratios (`error_rate_path`)."""
    path = error_rate_path(units, alpha=alpha, odds_ratios=odds_ratios, start=start)
    c_n, c_k, t_n, t_k = path.totals
    return ErrorRateTest(
        log_e=path.log_e,
        boundary=math.log(1.0 / alpha),
        rejected=path.rejected,
        control_rate=c_k / c_n if c_n else None,
        treatment_rate=t_k / t_n if t_n else None,
    )


def error_rate_path(
    units: Iterable[UnitErrors],
    *,
    alpha: float,
    odds_ratios: Sequence[float] = ODDS_RATIOS,
    start: ErrorRatePath | None = None,
) -> ErrorRatePath:
    """`start` (none: the empty path) continued by `units` in time order."""
    if not 0.0 < alpha < 1.0:
        raise ValueError("alpha must lie in (0, 1)")
    if not odds_ratios or any(not theta > 1.0 for theta in odds_ratios):
        raise ValueError("odds ratios must be > 1")
    path = start if start is not None else ErrorRatePath(logs=(0.0,) * len(odds_ratios))
    if len(path.logs) != len(odds_ratios):
        raise ValueError("the path was made with other odds ratios")
    boundary = math.log(1.0 / alpha)
    logs = list(path.logs)
    lam = [math.log(theta) for theta in odds_ratios]
    rejected = path.rejected
    best = path.log_e
    totals = list(path.totals)
    for u in units:
        totals[0] += u.control_requests
        totals[1] += u.control_errors
        totals[2] += u.treatment_requests
        totals[3] += u.treatment_errors
        n = u.control_requests + u.treatment_requests
        errors = u.control_errors + u.treatment_errors
        if errors == 0 or u.control_requests == 0 or u.treatment_requests == 0:
            continue
        pi = u.treatment_requests / n
        for i, theta in enumerate(odds_ratios):
            logs[i] += lam[i] * u.treatment_errors - errors * math.log1p(pi * (theta - 1.0))
        best = _log_mean_exp(logs)
        rejected = rejected or best >= boundary
    return ErrorRatePath(tuple(logs), best, rejected, (totals[0], totals[1], totals[2], totals[3]))


def _log_mean_exp(xs: Sequence[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs) / len(xs))
