"""How many samples per arm it takes to detect a given change of the median.

The sample median of log latency is asymptotically normal with variance 1 / (4 n f^2), f the
density of log latency at its median. For a relative change `effect` and a two-sided level-alpha
test with the given power, each arm needs
    n = (z_{1-alpha/2} + z_{power})^2 * (1/(4 f_c^2) + 1/(4 f_t^2)) / log(1 + effect)^2,
f estimated per arm from its histogram: a Gaussian kernel with Silverman's bandwidth at the median.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

from specproxy.stats.estimate.outliers import log_quantiles
from specproxy.stats.sample import ArmSample
from specproxy.summary.histogram import bin_log_centres

__all__ = ["density_at_median", "samples_for_median_change", "samples_from_densities"]


def density_at_median(sample: ArmSample) -> float:
    """Kernel estimate of the density of log values at their median (NaN below 10 values)."""
    bins, counts = sample.pooled()
    n = float(counts.sum())
    if n < 10:
        return math.nan
    logs = bin_log_centres(bins)
    w = counts.astype(np.float64)
    mean = float(w @ logs) / n
    sd = math.sqrt(max(float(w @ (logs - mean) ** 2) / (n - 1.0), 0.0))
    q25, median, q75 = log_quantiles(bins, counts, [0.25, 0.5, 0.75])
    iqr = float(q75 - q25)
    spread = min(sd, iqr / 1.349) if iqr > 0 else sd
    if spread <= 0:
        return math.inf
    bandwidth = 0.9 * spread * math.pow(n, -0.2)
    kernel = np.asarray(stats.norm.pdf((logs - float(median)) / bandwidth), dtype=np.float64)
    return float(w @ kernel) / (n * bandwidth)


def samples_for_median_change(
    control: ArmSample,
    treatment: ArmSample,
    *,
    effect: float = 0.05,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int | None:
    """Samples per arm to detect a relative median change of `effect`; None if unknowable yet."""
    return samples_from_densities(
        density_at_median(control),
        density_at_median(treatment),
        effect=effect,
        alpha=alpha,
        power=power,
    )


def samples_from_densities(
    f_c: float, f_t: float, *, effect: float = 0.05, alpha: float = 0.05, power: float = 0.8
) -> int | None:
    """The module's formula from each arm's density of log latency at its median."""
    if not (math.isfinite(f_c) and math.isfinite(f_t)) or f_c <= 0 or f_t <= 0:
        return None
    z = float(stats.norm.ppf(1 - alpha / 2) + stats.norm.ppf(power))
    variance = 1.0 / (4 * f_c**2) + 1.0 / (4 * f_t**2)
    return math.ceil(z**2 * variance / math.log1p(effect) ** 2)
