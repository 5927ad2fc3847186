"""Output-length-adjusted E2E speedup, from the window's moment sums.

Speculative decoding does not change what is generated, so output and prompt length are valid
covariates. Per arm, OLS of log e2e on (1, z_out, z_prompt), z = log tokens centred on the pooled
means; exp(-(b_t - b_c)) of the intercepts is the speedup of a request of typical length. The fit
needs only `summary.minute.MOMENT_SUMS` per arm, so a window's estimate is exact from its units.
The CI bootstraps the time blocks of E2E's interval (one Poisson weight per block for both arms,
`method` "block"), or with too few blocks is the OLS one with each arm's residual variance ("iid").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import stats

from specproxy.stats import result as schema
from specproxy.stats.estimate.blocklength import BlockPlan
from specproxy.stats.estimate.bootstrap import percentile_interval
from specproxy.summary.minute import MOMENT_SUMS

__all__ = ["MIN_ADJUST_N", "AdjustedSpeedup", "adjusted_from_moments", "adjusted_over_blocks"]

FloatArray = npt.NDArray[np.float64]
MIN_ADJUST_N: Final = 10  # per arm


@dataclass(frozen=True, slots=True)
class AdjustedSpeedup:
    """Length-adjusted speedup of E2E (> 1: speculative faster) with its CI."""

    estimate: float
    lower: float
    upper: float
    n: int
    r_squared: float
    covariates: tuple[str, ...]

    method: str = "block"

    def to_dict(self) -> schema.Adjusted:
        return {
            "estimate": self.estimate,
            "lower": _finite(self.lower),
            "upper": _finite(self.upper),
            "n": self.n,
            "r_squared": self.r_squared,
            "covariates": list(self.covariates),
            "method": self.method,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


_N, _SU, _SV, _SUU, _SVV, _SUV, _SY, _SUY, _SVY, _SYY = range(len(MOMENT_SUMS))
# pooled variance of log prompt tokens at or below this: a constant prompt length, which would
# duplicate the intercept (the rows' test is np.ptp == 0)
_CONSTANT_VARIANCE: Final = 1e-12


def _fits(
    base: FloatArray, spec: FloatArray, with_prompt: bool
) -> tuple[FloatArray, FloatArray, FloatArray, FloatArray, FloatArray]:
    """Per row of `base`/`spec` (..., MOMENT_SUMS): b1 (speculative minus baseline intercept at
    the pooled means), each arm's residual sum of squares and (X'X)^-1[0, 0], and the pooled
    total sum of squares of log e2e."""
    total_n = base[..., _N] + spec[..., _N]
    with np.errstate(invalid="ignore", divide="ignore"):
        u_bar = (base[..., _SU] + spec[..., _SU]) / total_n
        v_bar = (base[..., _SV] + spec[..., _SV]) / total_n
    out: list[FloatArray] = []
    inverse00: list[FloatArray] = []
    ssr: list[FloatArray] = []
    for m in (base, spec):
        n = m[..., _N]
        su, sv = m[..., _SU] - n * u_bar, m[..., _SV] - n * v_bar
        suu = m[..., _SUU] - 2 * u_bar * m[..., _SU] + n * u_bar**2
        svv = m[..., _SVV] - 2 * v_bar * m[..., _SV] + n * v_bar**2
        suv = m[..., _SUV] - u_bar * m[..., _SV] - v_bar * m[..., _SU] + n * u_bar * v_bar
        sy = m[..., _SY]
        suy, svy = m[..., _SUY] - u_bar * sy, m[..., _SVY] - v_bar * sy
        if with_prompt:
            xtx = np.stack(
                [
                    np.stack([n, su, sv], -1),
                    np.stack([su, suu, suv], -1),
                    np.stack([sv, suv, svv], -1),
                ],
                -2,
            )
            xty = np.stack([sy, suy, svy], -1)
        else:
            xtx = np.stack([np.stack([n, su], -1), np.stack([su, suu], -1)], -2)
            xty = np.stack([sy, suy], -1)
        inv = np.linalg.pinv(np.nan_to_num(xtx))
        theta = np.einsum("...ij,...j->...i", inv, xty)
        out.append(theta[..., 0])
        inverse00.append(inv[..., 0, 0])
        ssr.append(m[..., _SYY] - np.einsum("...i,...i->...", theta, xty))
    with np.errstate(invalid="ignore", divide="ignore"):  # a replicate that lost both arms
        sst = base[..., _SYY] + spec[..., _SYY] - (base[..., _SY] + spec[..., _SY]) ** 2 / total_n
    b1 = out[1] - out[0]
    return b1, ssr[0] + ssr[1], np.stack(ssr, -1), np.stack(inverse00, -1), sst


def adjusted_from_moments(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    weights: FloatArray | None = None,
    confidence: float = 0.95,
) -> AdjustedSpeedup | None:
    """The adjusted speedup from per-block `MOMENT_SUMS` (blocks x 10 per arm, blocks aligned
    across the arms). `weights` (resamples x blocks, one Poisson weight per block shared by both
    arms) gives the block-bootstrap CI; None the OLS one (module docstring). None when an arm
    has fewer than `MIN_ADJUST_N` requests."""
    b_tot, s_tot = baseline.sum(axis=0), speculative.sum(axis=0)
    if b_tot[_N] < MIN_ADJUST_N or s_tot[_N] < MIN_ADJUST_N:
        return None
    total_n = b_tot[_N] + s_tot[_N]
    v_bar = (b_tot[_SV] + s_tot[_SV]) / total_n
    with_prompt = (b_tot[_SVV] + s_tot[_SVV]) / total_n - v_bar**2 > _CONSTANT_VARIANCE
    b1, ssr, arm_ssr, inverse00, sst = _fits(b_tot, s_tot, with_prompt)
    effect = float(b1)
    p = 3 if with_prompt else 2
    if weights is not None:
        b_reps, s_reps = weights @ baseline, weights @ speculative
        b1_reps = _fits(b_reps, s_reps, with_prompt)[0]
        enough = (b_reps[:, _N] >= MIN_ADJUST_N) & (s_reps[:, _N] >= MIN_ADJUST_N)
        b1_reps = np.where(enough, b1_reps, np.nan)  # a replicate that lost an arm
        lo_effect, hi_effect = percentile_interval(-b1_reps, confidence)
        lower, upper, method = math.exp(lo_effect), math.exp(hi_effect), "block"
    else:
        sizes = np.array([b_tot[_N], s_tot[_N]])
        variance = float(np.sum(arm_ssr / np.maximum(sizes - p, 1.0) * inverse00))
        se = math.sqrt(max(variance, 0.0))
        z = float(stats.norm.ppf(0.5 + confidence / 2.0))
        lower, upper, method = math.exp(-effect - z * se), math.exp(-effect + z * se), "iid"
    names = ("log_output_tokens", "log_prompt_tokens")[: p - 1]
    return AdjustedSpeedup(
        estimate=math.exp(-effect),
        lower=lower,
        upper=upper,
        n=int(total_n),
        r_squared=1.0 - float(ssr) / float(sst) if float(sst) > 0 else 0.0,
        covariates=names,
        method=method,
    )


def adjusted_over_blocks(
    control: FloatArray,
    treatment: FloatArray,
    plan: BlockPlan,
    *,
    resamples: int,
    confidence: float,
    rng: np.random.Generator,
) -> AdjustedSpeedup | None:
    """The adjusted speedup from per-unit moments (units x MOMENT_SUMS per arm, the units of
    `plan`), its CI over `plan`'s time blocks when it has enough of them, else the OLS one."""
    per_block = []
    for units in (control, treatment):
        block = np.arange(units.shape[0]) // max(plan.block_units, 1)
        sums = np.zeros((max(plan.blocks, 1), units.shape[1]))
        np.add.at(sums, block, units)
        per_block.append(sums)
    weights = (
        rng.poisson(1.0, size=(resamples, per_block[0].shape[0])).astype(np.float64)
        if plan.reliable
        else None
    )
    return adjusted_from_moments(per_block[0], per_block[1], weights=weights, confidence=confidence)
