"""The length adjustment from rollup moments equals the rows' regression (same requests), and
its CIs: the OLS one beside HC3, the block bootstrap's coverage under minute-level noise."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.stats.estimate.adjust import adjusted_from_moments, adjusted_speedup
from specproxy.summary.minute import moment_values

FloatArray = npt.NDArray[np.float64]


def _arm(
    rng: np.random.Generator, n: int, speedup: float, noise: FloatArray | None = None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    out = rng.integers(8, 400, n).astype(np.float64)
    prompt = rng.integers(4, 2000, n).astype(np.float64)
    log_e2e = -3.0 + 0.9 * np.log(out) + 0.1 * np.log(prompt) + rng.normal(0, 0.2, n)
    if noise is not None:
        log_e2e = log_e2e + noise
    return np.exp(log_e2e) / speedup, out, prompt


def _blocks(
    arm: tuple[FloatArray, FloatArray, FloatArray], unit: npt.NDArray[np.int64], units: int
) -> FloatArray:
    e2e, out, prompt = arm
    return np.stack(
        [moment_values(e2e[unit == u], out[unit == u], prompt[unit == u]) for u in range(units)]
    )


def test_the_estimate_from_moments_is_the_rows_regression() -> None:
    rng = np.random.default_rng(1)
    base, spec = _arm(rng, 3000, 1.0), _arm(rng, 2500, 1.3)
    rows = adjusted_speedup(
        base[0], base[1], spec[0], spec[1], baseline_prompt_tokens=base[2],
        speculative_prompt_tokens=spec[2],
    )  # fmt: skip
    assert rows is not None and rows.method == "hc3"
    units_b, units_s = rng.integers(0, 40, 3000), rng.integers(0, 40, 2500)
    mb, ms = _blocks(base, units_b, 40), _blocks(spec, units_s, 40)
    ols = adjusted_from_moments(mb, ms)
    assert ols is not None and ols.method == "iid"
    assert ols.estimate == pytest.approx(rows.estimate, rel=1e-9)
    assert ols.r_squared == pytest.approx(rows.r_squared, rel=1e-9)
    assert ols.n == rows.n and ols.covariates == rows.covariates
    # homoskedastic noise: the OLS interval is the HC3 one, up to the HC3 correction
    assert math.log(ols.upper / ols.lower) == pytest.approx(
        math.log(rows.upper / rows.lower), rel=0.05
    )
    weights = rng.poisson(1.0, size=(2000, 40)).astype(np.float64)
    block = adjusted_from_moments(mb, ms, weights=weights)
    assert block is not None and block.method == "block"
    assert block.estimate == ols.estimate
    assert math.log(block.upper / block.lower) == pytest.approx(
        math.log(ols.upper / ols.lower), rel=0.15
    )


def test_a_constant_prompt_length_drops_that_covariate_and_few_requests_give_none() -> None:
    rng = np.random.default_rng(2)
    base, spec = _arm(rng, 500, 1.0), _arm(rng, 500, 1.2)
    base, spec = (base[0], base[1], np.full(500, 64.0)), (spec[0], spec[1], np.full(500, 64.0))
    rows = adjusted_speedup(
        base[0], base[1], spec[0], spec[1], baseline_prompt_tokens=base[2],
        speculative_prompt_tokens=spec[2],
    )  # fmt: skip
    unit = np.arange(500) % 25
    got = adjusted_from_moments(_blocks(base, unit, 25), _blocks(spec, unit, 25))
    assert rows is not None and got is not None
    assert got.covariates == rows.covariates == ("log_output_tokens",)
    assert got.estimate == pytest.approx(rows.estimate, rel=1e-9)
    few = _blocks((base[0][:9], base[1][:9], base[2][:9]), np.zeros(9, np.int64), 1)
    assert adjusted_from_moments(few, _blocks(spec, unit, 25)[:1]) is None


@pytest.mark.slow
def test_the_block_interval_covers_under_minute_noise_where_the_ols_one_does_not() -> None:
    """Minute-level load noise shared by both arms (sd 0.15 on log E2E, 40 minutes) with a split
    that drifts from minute to minute (0.25-0.75 speculative), so the noise does not cancel
    between the arms: the block bootstrap over minutes covers the true speedup ~95 %; the OLS
    interval, which sees only the request-level noise, under-covers."""
    rng = np.random.default_rng(3)
    runs, minutes, per_minute, true = 300, 40, 60, 1.25
    block_hits = ols_hits = 0
    for _ in range(runs):
        shock = rng.normal(0, 0.15, minutes)
        unit = np.repeat(np.arange(minutes), per_minute)
        share = rng.uniform(0.25, 0.75, minutes)
        arm_of = rng.random(unit.size) < share[unit]
        arms = []
        for is_spec, speedup in ((False, 1.0), (True, true)):
            sel = arm_of == is_spec
            arms.append((_arm(rng, int(sel.sum()), speedup, shock[unit[sel]]), unit[sel]))
        mb = _blocks(arms[0][0], arms[0][1], minutes)
        ms = _blocks(arms[1][0], arms[1][1], minutes)
        weights = rng.poisson(1.0, size=(999, minutes)).astype(np.float64)
        block = adjusted_from_moments(mb, ms, weights=weights)
        ols = adjusted_from_moments(mb, ms)
        assert block is not None and ols is not None
        block_hits += block.lower <= true <= block.upper
        ols_hits += ols.lower <= true <= ols.upper
    block_rate, ols_rate = block_hits / runs, ols_hits / runs
    print(f"\nadjusted speedup coverage, minute noise: block {block_rate:.3f}, OLS {ols_rate:.3f}")
    assert 0.92 <= block_rate <= 0.985
    assert ols_rate < 0.85
