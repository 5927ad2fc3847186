"""How many samples per arm it takes to detect a given change of the median.

The sample median of log latency is asymptotically normal with variance 1 / (4 n f^2), f the
density of log latency at its median. For a relative change `effect` of the median and a
two-sided level-alpha test with the given power, each arm needs

    n = (z_{1-alpha/2} + z_{power})^2 * (1/(4 f_b^2) + 1/(4 f_s^2)) / log(1 + effect)^2.

f is estimated per arm with a Gaussian kernel (Silverman's bandwidth) at the sample median.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
from scipy import stats

__all__ = ["log_density_at_median", "samples_for_median_change", "samples_from_densities"]

FloatArray = npt.NDArray[np.float64]


def log_density_at_median(values: FloatArray) -> float:
    """Kernel estimate of the density of log(values) at its median (NaN if < 10 values)."""
    if values.size < 10:
        return math.nan
    logs = np.log(values)
    sd = float(np.std(logs, ddof=1))
    iqr = float(np.subtract(*np.quantile(logs, [0.75, 0.25])))
    spread = min(sd, iqr / 1.349) if iqr > 0 else sd
    if spread <= 0:
        return math.inf
    bandwidth = 0.9 * spread * logs.size ** (-0.2)
    centre = float(np.median(logs))
    return float(np.mean(stats.norm.pdf((logs - centre) / bandwidth)) / bandwidth)


def samples_for_median_change(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    effect: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int | None:
    """Samples per arm to detect a relative median change of `effect`; None if unknowable yet."""
    return samples_from_densities(
        log_density_at_median(baseline),
        log_density_at_median(speculative),
        effect=effect,
        alpha=alpha,
        power=power,
    )


def samples_from_densities(
    f_b: float, f_s: float, *, effect: float = 0.05, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """The formula of the module docstring from each arm's density of log latency at its
    median (however estimated: from values, or from a histogram, `binned`)."""
    if not (math.isfinite(f_b) and math.isfinite(f_s)) or f_b <= 0 or f_s <= 0:
        return None
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    variance = 1.0 / (4 * f_b**2) + 1.0 / (4 * f_s**2)
    return math.ceil(z**2 * variance / math.log1p(effect) ** 2)
