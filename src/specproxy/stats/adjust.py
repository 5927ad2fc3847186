"""Output-length-adjusted E2E speedup.

Speculative decoding does not change what is generated, so output (and prompt) length is a valid
covariate: it is independent of the arm. Most of the spread of E2E latency is length, so
regressing it out shrinks the CI a lot. We fit, by ordinary least squares,

    log e2e = b0 + b1*spec + b2*z_out + b3*z_prompt + b4*spec*z_out + b5*spec*z_prompt + e,

with z = log(tokens) centred on the pooled mean. The interactions let the decode-speed gain
differ from the prefill cost; thanks to the centring, exp(-b1) is the speedup
(baseline / speculative) of a request of typical (geometric-mean) length. Its CI uses the
heteroskedasticity-robust HC3 sandwich variance and a normal quantile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import stats

from specproxy.stats import result as schema

__all__ = ["MIN_ADJUST_N", "AdjustedSpeedup", "adjusted_speedup"]

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

    def to_dict(self) -> schema.Adjusted:
        return {
            "estimate": self.estimate,
            "lower": self.lower,
            "upper": self.upper,
            "n": self.n,
            "r_squared": self.r_squared,
            "covariates": list(self.covariates),
        }


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
