"""The error-rate e-process: valid under a drifting error rate and a changing share, and it
detects a treatment that errs more."""

from __future__ import annotations

import numpy as np
import pytest

from specproxy.stats.anytime.errorrate import (
    ErrorRatePath,
    UnitErrors,
    error_rate_path,
    error_rate_test,
)


def _units(
    rng: np.random.Generator, shares: list[float], p_control: list[float], odds: float
) -> list[UnitErrors]:
    out = []
    for share, p in zip(shares, p_control, strict=True):
        n_t = int(rng.binomial(400, share))
        n_c = 400 - n_t
        p_t = odds * p / (1 - p + odds * p)
        out.append(UnitErrors(n_c, int(rng.binomial(n_c, p)), n_t, int(rng.binomial(n_t, p_t))))
    return out


def _ramp(minutes: int) -> tuple[list[float], list[float]]:
    # the share ramps 1% -> 50% while the error rate drifts 10x: pooling would mislead
    shares = [(0.01, 0.05, 0.25, 0.5)[min(3, 4 * m // minutes)] for m in range(minutes)]
    rates = [0.002 + 0.02 * m / minutes for m in range(minutes)]
    return shares, rates


@pytest.mark.slow
def test_equal_rates_reject_at_most_alpha_under_drift_and_ramp() -> None:
    rng = np.random.default_rng(7)
    shares, rates = _ramp(60)
    rejected = sum(
        error_rate_test(_units(rng, shares, rates, 1.0), alpha=0.05).rejected for _ in range(400)
    )
    assert rejected <= 0.05 * 400


def test_a_treatment_with_double_the_error_odds_is_detected() -> None:
    rng = np.random.default_rng(3)
    shares, rates = _ramp(60)
    result = error_rate_test(_units(rng, shares, rates, 3.0), alpha=0.05)
    assert result.rejected
    assert result.treatment_rate is not None and result.control_rate is not None
    assert result.treatment_rate > result.control_rate


def test_fewer_treatment_errors_never_reject() -> None:
    units = [UnitErrors(100, 5, 100, 0)] * 50
    result = error_rate_test(units, alpha=0.05)
    assert not result.rejected and result.log_e < 0


def test_units_without_errors_or_an_arm_carry_no_evidence() -> None:
    units = [UnitErrors(100, 0, 100, 0), UnitErrors(0, 0, 50, 10), UnitErrors(50, 5, 0, 0)]
    result = error_rate_test(units, alpha=0.05)
    assert result.log_e == 0.0 and not result.rejected


def test_bad_counts_and_levels_are_refused() -> None:
    with pytest.raises(ValueError, match="errors"):
        UnitErrors(10, 11, 0, 0)
    with pytest.raises(ValueError, match="alpha"):
        error_rate_test([], alpha=1.0)
    with pytest.raises(ValueError, match="odds"):
        error_rate_test([], alpha=0.05, odds_ratios=(1.0,))


def test_feeding_the_units_in_pieces_gives_the_test_of_all_of_them() -> None:
    shares, rates = _ramp(200)
    units = _units(np.random.default_rng(7), shares, rates, odds=1.6)
    whole = error_rate_test(units, alpha=0.01)
    assert whole.rejected  # a crossing inside a piece must survive the pieces after it
    path = ErrorRatePath()
    for first, stop in ((0, 1), (1, 40), (40, 41), (41, 199), (199, 200)):
        path = error_rate_path(units[first:stop], alpha=0.01, start=path)
    assert error_rate_test([], alpha=0.01, start=path) == whole
    with pytest.raises(ValueError, match="odds ratios"):
        error_rate_path(units, alpha=0.01, odds_ratios=(2.0,), start=path)
