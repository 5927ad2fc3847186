"""Output-length-adjusted E2E speedup.

Speculative decoding does not change what is generated, so output (and prompt) length is a valid
covariate: it is independent of the arm. Most of the spread of E2E latency is length, so
regressing it out shrinks the CI a lot. We fit, by ordinary least squares,

    log e2e = b0 + b1*spec + b2*z_out + b3*z_prompt + b4*spec*z_out + b5*spec*z_prompt + e,

with z = log(tokens) centred on the pooled mean. The interactions let the decode-speed gain
differ from the prefill cost; thanks to the centring, exp(-b1) is the speedup
(baseline / speculative) of a request of typical (geometric-mean) length. Its CI uses the
heteroskedasticity-robust HC3 sandwich variance and a normal quantile (`method` "hc3").

From rollups (`adjusted_from_moments`): the model is fully interacted, so it is one OLS per arm
of log e2e on (1, z_out, z_prompt), and b1 is the difference of the two arms' intercepts at the
pooled means; both need only each arm's `rollup.MOMENT_SUMS`, so the estimate equals the rows'
(the same requests: those reporting both token counts). HC3 needs each request's residual, so
the CI is a time-block Poisson bootstrap of the per-block sums, one weight per block shared by
both arms as in `blockboot` (`method` "block"), or, with fewer than `blocklength.MIN_BLOCKS`
blocks, the classical OLS variance with each arm's own residual variance (`method` "iid").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import stats

from specproxy.stats import result as schema
from specproxy.stats.estimate.bootstrap import percentile_interval
from specproxy.summary.minute import MOMENT_SUMS

__all__ = ["MIN_ADJUST_N", "AdjustedSpeedup", "adjusted_from_moments", "adjusted_speedup"]

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

    method: str = "hc3"

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


def _usable(e2e: FloatArray, out: FloatArray, prompt: FloatArray | None) -> npt.NDArray[np.bool_]:
    ok = np.isfinite(e2e) & (e2e > 0) & np.isfinite(out) & (out > 0)
    if prompt is not None:
        ok &= np.isfinite(prompt) & (prompt > 0)
    return ok


def adjusted_speedup(
    baseline_e2e: FloatArray,
    baseline_output_tokens: FloatArray,
    speculative_e2e: FloatArray,
    speculative_output_tokens: FloatArray,
    *,
    baseline_prompt_tokens: FloatArray | None = None,
    speculative_prompt_tokens: FloatArray | None = None,
    confidence: float = 0.95,
) -> AdjustedSpeedup | None:
    """The adjusted speedup, or None when an arm has fewer than `MIN_ADJUST_N` usable rows."""
    ok_b = _usable(baseline_e2e, baseline_output_tokens, None)
    ok_s = _usable(speculative_e2e, speculative_output_tokens, None)
    prompt: FloatArray | None = None
    if baseline_prompt_tokens is not None and speculative_prompt_tokens is not None:
        with_b = _usable(baseline_e2e, baseline_output_tokens, baseline_prompt_tokens)
        with_s = _usable(speculative_e2e, speculative_output_tokens, speculative_prompt_tokens)
        if int(with_b.sum()) >= MIN_ADJUST_N and int(with_s.sum()) >= MIN_ADJUST_N:
            candidate = np.log(
                np.concatenate([baseline_prompt_tokens[with_b], speculative_prompt_tokens[with_s]])
            )
            if float(np.ptp(candidate)) > 0.0:  # a constant would duplicate the intercept
                prompt, ok_b, ok_s = candidate, with_b, with_s
    if int(ok_b.sum()) < MIN_ADJUST_N or int(ok_s.sum()) < MIN_ADJUST_N:
        return None
    y = np.log(np.concatenate([baseline_e2e[ok_b], speculative_e2e[ok_s]]))
    spec = np.concatenate([np.zeros(int(ok_b.sum())), np.ones(int(ok_s.sum()))])
    z_out = np.log(np.concatenate([baseline_output_tokens[ok_b], speculative_output_tokens[ok_s]]))
    covariates = [z_out - z_out.mean()]
    names = ["log_output_tokens"]
    if prompt is not None:
        covariates.append(prompt - prompt.mean())
        names.append("log_prompt_tokens")
    columns = [np.ones_like(y), spec, *covariates, *(spec * z for z in covariates)]
    x = np.column_stack(columns)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    resid = y - x @ coef
    xtx_inv = np.linalg.pinv(x.T @ x)
    leverage = np.einsum("ij,jk,ik->i", x, xtx_inv, x)
    scaled = resid / np.clip(1.0 - leverage, 1e-12, None)  # HC3
    meat = (x * scaled[:, None] ** 2).T @ x
    cov = xtx_inv @ meat @ xtx_inv
    se = math.sqrt(max(float(cov[1, 1]), 0.0))
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    total = float(np.sum((y - y.mean()) ** 2))
    r2 = 1.0 - float(resid @ resid) / total if total > 0 else 0.0
    effect = float(coef[1])
    return AdjustedSpeedup(
        estimate=math.exp(-effect),
        lower=math.exp(-effect - z * se),
        upper=math.exp(-effect + z * se),
        n=int(y.size),
        r_squared=r2,
        covariates=tuple(names),
    )


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
