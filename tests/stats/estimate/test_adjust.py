"""The length adjustment (`estimate.adjust`) from per-unit moments equals the rows' regression
(the HC3 oracle, same requests), and its CIs: the OLS one beside HC3, the block bootstrap over
the plan's time blocks, and (slow) its coverage under minute-level noise."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.stats.estimate.adjust import adjusted_from_moments, adjusted_over_blocks
from specproxy.stats.estimate.blocklength import BlockPlan, plan_blocks
from specproxy.stats.sample import ArmSample
from specproxy.summary.minute import moment_values
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Arm = tuple[FloatArray, FloatArray, FloatArray]  # e2e, output tokens, prompt tokens


def _arm(rng: np.random.Generator, n: int, speedup: float, noise: FloatArray | None = None) -> Arm:
    out = rng.integers(8, 400, n).astype(np.float64)
    prompt = rng.integers(4, 2000, n).astype(np.float64)
    log_e2e = -3.0 + 0.9 * np.log(out) + 0.1 * np.log(prompt) + rng.normal(0, 0.2, n)
    if noise is not None:
        log_e2e = log_e2e + noise
    return np.exp(log_e2e) / speedup, out, prompt


def _units(arm: Arm, unit: IntArray, units: int) -> FloatArray:
    """The arm's `MOMENT_SUMS` per time unit (units x 10), as the summaries hold them."""
    e2e, out, prompt = arm
    return np.stack(
        [moment_values(e2e[unit == u], out[unit == u], prompt[unit == u]) for u in range(units)]
    )


def _r_squared(base: Arm, spec: Arm, with_prompt: bool) -> float:
    """R^2 of the rows' regression: log e2e on the arm, the centred log token counts and their
    interactions with the arm (each arm its own fit)."""
    y = np.log(np.concatenate([base[0], spec[0]]))
    arm = np.concatenate([np.zeros(base[0].size), np.ones(spec[0].size)])
    covariates = [
        np.log(np.concatenate([base[i], spec[i]])) for i in ((1, 2) if with_prompt else (1,))
    ]
    centred = [z - z.mean() for z in covariates]
    x = np.column_stack([np.ones_like(y), arm, *centred, *(arm * z for z in centred)])
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    return 1.0 - float(resid @ resid) / float(np.sum((y - y.mean()) ** 2))


def test_the_estimate_from_moments_is_the_rows_regression() -> None:
    rng = np.random.default_rng(1)
    base, spec = _arm(rng, 3000, 1.0), _arm(rng, 2500, 1.3)
    rows = oracles.adjusted_hc3(
        base[0], base[1], spec[0], spec[1], baseline_prompt_tokens=base[2],
        speculative_prompt_tokens=spec[2],
    )  # fmt: skip
    assert rows is not None
    estimate, lower, upper = rows
    units_b, units_s = rng.integers(0, 40, 3000), rng.integers(0, 40, 2500)
    mb, ms = _units(base, units_b, 40), _units(spec, units_s, 40)
    ols = adjusted_from_moments(mb, ms)
    assert ols is not None and ols.method == "iid"
    assert ols.estimate == pytest.approx(estimate, rel=1e-9)
    assert ols.r_squared == pytest.approx(_r_squared(base, spec, True), rel=1e-9)
    assert ols.n == 5500 and ols.covariates == ("log_output_tokens", "log_prompt_tokens")
    # homoskedastic noise: the OLS interval is the HC3 one, up to the HC3 correction
    assert math.log(ols.upper / ols.lower) == pytest.approx(math.log(upper / lower), rel=0.05)
    weights = rng.poisson(1.0, size=(2000, 40)).astype(np.float64)
    block = adjusted_from_moments(mb, ms, weights=weights)
    assert block is not None and block.method == "block"
    assert block.estimate == ols.estimate
    assert math.log(block.upper / block.lower) == pytest.approx(
        math.log(ols.upper / ols.lower), rel=0.15
    )
    assert block.to_dict()["covariates"] == ["log_output_tokens", "log_prompt_tokens"]


def test_a_constant_prompt_length_drops_that_covariate_and_few_requests_give_none() -> None:
    rng = np.random.default_rng(2)
    base, spec = _arm(rng, 500, 1.0), _arm(rng, 500, 1.2)
    base, spec = (base[0], base[1], np.full(500, 64.0)), (spec[0], spec[1], np.full(500, 64.0))
    rows = oracles.adjusted_hc3(
        base[0], base[1], spec[0], spec[1], baseline_prompt_tokens=base[2],
        speculative_prompt_tokens=spec[2],
    )  # fmt: skip
    unit = np.arange(500) % 25
    got = adjusted_from_moments(_units(base, unit, 25), _units(spec, unit, 25))
    assert rows is not None and got is not None
    assert got.covariates == ("log_output_tokens",)
    assert got.estimate == pytest.approx(rows[0], rel=1e-9)
    assert got.r_squared == pytest.approx(_r_squared(base, spec, False), rel=1e-9)
    few = _units((base[0][:9], base[1][:9], base[2][:9]), np.zeros(9, np.int64), 1)
    assert adjusted_from_moments(few, _units(spec, unit, 25)[:1]) is None


def test_over_blocks_sums_the_plans_blocks_and_bootstraps_them_when_reliable() -> None:
    rng = np.random.default_rng(3)
    units = 45
    base, spec = _arm(rng, 2000, 1.0), _arm(rng, 2000, 1.2)
    mb = _units(base, rng.integers(0, units, 2000), units)
    ms = _units(spec, rng.integers(0, units, 2000), units)
    plan = BlockPlan(units, 2, 23, 1.0, True)  # 22 blocks of 2 units, the last one of 1
    got = adjusted_over_blocks(
        mb, ms, plan, resamples=500, confidence=0.95, rng=np.random.default_rng(4)
    )
    blocks = np.arange(units) // 2
    per_block = [np.stack([m[blocks == k].sum(axis=0) for k in range(23)]) for m in (mb, ms)]
    weights = np.random.default_rng(4).poisson(1.0, size=(500, 23)).astype(np.float64)
    want = adjusted_from_moments(*per_block, weights=weights)
    assert got is not None and want is not None
    assert got == want and got.method == "block"
    few = BlockPlan(units, 5, 9, 1.0, False)  # too few blocks: the OLS interval
    ols = adjusted_over_blocks(mb, ms, few, resamples=500, confidence=0.95, rng=rng)
    per_unit = adjusted_from_moments(mb, ms)
    assert ols is not None and per_unit is not None and ols.method == "iid"
    assert (ols.estimate, ols.lower, ols.upper, ols.r_squared) == pytest.approx(
        (per_unit.estimate, per_unit.lower, per_unit.upper, per_unit.r_squared), rel=1e-12
    )


@pytest.mark.slow
def test_the_block_interval_covers_under_minute_noise_where_the_ols_one_does_not() -> None:
    """Minute-level load noise shared by both arms (sd 0.15 on log E2E, 40 minutes) with a split
    that drifts from minute to minute (0.25-0.75 speculative), so the noise does not cancel
    between the arms: the block bootstrap over the plan's blocks of minutes (the plan the E2E
    samples give, as in a window's comparison) covers the true speedup ~95 %; the OLS interval,
    which sees only the request-level noise, under-covers."""
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
        samples = [ArmSample.from_values(a[0], u, minutes) for a, u in arms]
        plan = plan_blocks([s.unit_log_means() for s in samples], minutes)
        mb, ms = (_units(a, u, minutes) for a, u in arms)
        block = adjusted_over_blocks(mb, ms, plan, resamples=999, confidence=0.95, rng=rng)
        ols = adjusted_from_moments(mb, ms)
        assert block is not None and ols is not None and block.method == "block"
        block_hits += block.lower <= true <= block.upper
        ols_hits += ols.lower <= true <= ols.upper
    block_rate, ols_rate = block_hits / runs, ols_hits / runs
    print(f"\nadjusted speedup coverage, minute noise: block {block_rate:.3f}, OLS {ols_rate:.3f}")
    assert 0.92 <= block_rate <= 0.985
    assert ols_rate < 0.85
