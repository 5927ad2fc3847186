"""Exact per-request reference implementations: the oracles the one-form estimators are checked
against (within the grid bound). They are test code: production reads only `ArmSample`s.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats

from specproxy.stats.anytime.exceedance import UnitCounts, predictable_thresholds
from specproxy.stats.anytime.sequential import count_boundaries
from specproxy.stats.estimate.adjust import MIN_ADJUST_N
from specproxy.stats.estimate.bootstrap import Interval, percentile_interval
from specproxy.stats.estimate.quantile import QUANTILE_LEVELS
from specproxy.summary.histogram import bin_index

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]
_CHUNK_ELEMENTS = 4_000_000


# numpy's own statistic over an axis (scipy.stats.bootstrap's `statistic`)
AXIS_STATISTICS: dict[str, Callable[..., Any]] = {
    "median": lambda x, axis: np.median(x, axis=axis),
    "mean": lambda x, axis: np.mean(x, axis=axis),
    "p90": lambda x, axis: np.quantile(x, 0.9, axis=axis),
}


def point_statistic(values: FloatArray, statistic: str) -> float:
    """numpy's statistic of the values (linear-interpolated quantiles)."""
    if values.size == 0:
        return math.nan
    if statistic == "mean":
        return float(np.mean(values))
    return float(np.quantile(values, QUANTILE_LEVELS[statistic]))


def _chunks(resamples: int, n: int) -> list[int]:
    per = max(1, _CHUNK_ELEMENTS // max(n, 1))
    sizes = [per] * (resamples // per)
    if resamples % per:
        sizes.append(resamples % per)
    return sizes


def _order_stat_quantile(
    sorted_values: FloatArray, p: float, rng: np.random.Generator, resamples: int
) -> FloatArray:
    """Exact bootstrap draws of the linear-interpolated p-quantile (see module docstring)."""
    n = sorted_values.size
    h = (n - 1) * p
    j = math.floor(h)  # 0-based rank of the lower order statistic
    frac = h - j
    k = j + 1  # 1-based
    u_low = rng.beta(k, n - k + 1, size=resamples)
    i_low = np.clip(np.ceil(n * u_low).astype(np.int64) - 1, 0, n - 1)
    low = sorted_values[i_low]
    if frac == 0.0 or k >= n:
        return low
    u_high = u_low + (1.0 - u_low) * rng.beta(1, n - k, size=resamples)
    i_high = np.clip(np.ceil(n * u_high).astype(np.int64) - 1, 0, n - 1)
    return low + frac * (sorted_values[i_high] - low)


def _resampled_means(values: FloatArray, rng: np.random.Generator, resamples: int) -> FloatArray:
    n = values.size
    parts = [
        values[rng.integers(0, n, size=(size, n))].mean(axis=1) for size in _chunks(resamples, n)
    ]
    return np.concatenate(parts)


def split_replicates(
    values: FloatArray, statistics: Sequence[str], rng: np.random.Generator, resamples: int
) -> dict[str, FloatArray]:
    """Bootstrap replicates of each statistic for one arm resampled on its own (exact engine)."""
    ordered = np.sort(values)
    out: dict[str, FloatArray] = {}
    for stat in statistics:
        if stat == "mean":
            out[stat] = _resampled_means(ordered, rng, resamples)
        else:
            out[stat] = _order_stat_quantile(ordered, QUANTILE_LEVELS[stat], rng, resamples)
    return out


def split_speedup_intervals(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    statistics: Sequence[str],
    rng: np.random.Generator,
    resamples: int = 2000,
    confidence: float = 0.95,
) -> dict[str, Interval]:
    """The exact i.i.d. bootstrap of raw values (each arm resampled on its own)."""
    reps = [split_replicates(arm, statistics, rng, resamples) for arm in (baseline, speculative)]
    out: dict[str, Interval] = {}
    with np.errstate(invalid="ignore", divide="ignore"):
        for stat in statistics:
            estimate = point_statistic(baseline, stat) / point_statistic(speculative, stat)
            out[stat] = Interval(
                estimate, *percentile_interval(reps[0][stat] / reps[1][stat], confidence)
            )
    return out


def _count_le(a: FloatArray, b_sorted: FloatArray, d: float) -> int:
    """#pairs (i, j) with a_i - b_j <= d, for sorted b."""
    return int(np.sum(b_sorted.size - np.searchsorted(b_sorted, a - d, side="left")))


def _kth_difference(a: FloatArray, b_sorted: FloatArray, k: int, span: float) -> float:
    """The k-th smallest (1-based) of a_i - b_j, to within 1e-12 of the span."""
    lo = float(a.min() - b_sorted[-1]) - 1e-12
    hi = float(a.max() - b_sorted[0])
    tol = max(span, 1e-300) * 1e-12
    while hi - lo > tol:
        mid = 0.5 * (lo + hi)
        if not lo < mid < hi:  # adjacent floats: identical values (span 0) would loop forever
            break
        if _count_le(a, b_sorted, mid) >= k:
            hi = mid
        else:
            lo = mid
    return hi


def hodges_lehmann(
    a: FloatArray, b: FloatArray, confidence: float = 0.95
) -> tuple[float, float, float]:
    """HL shift a - b (median of pairwise differences) and its Moses CI."""
    n, m = a.size, b.size
    # `a` sorted too: the counts are sums over a (order-free), and sorted queries make each
    # bisection step's searchsorted ~4x faster (cache-friendly), which is most of a row tick
    a = np.sort(a)
    b_sorted = np.sort(b)
    span = float(max(a.max(), b.max()) - min(a.min(), b.min()))
    total = n * m
    if total % 2:
        estimate = _kth_difference(a, b_sorted, (total + 1) // 2, span)
    else:
        lo = _kth_difference(a, b_sorted, total // 2, span)
        estimate = 0.5 * (lo + _kth_difference(a, b_sorted, total // 2 + 1, span))
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    c = math.floor(total / 2.0 - z * math.sqrt(total * (n + m + 1) / 12.0))
    if c < 1:
        return estimate, -math.inf, math.inf
    return (
        estimate,
        _kth_difference(a, b_sorted, c, span),
        _kth_difference(a, b_sorted, total - c + 1, span),
    )


def rank_tests(
    baseline: FloatArray, speculative: FloatArray, confidence: float = 0.95
) -> tuple[float, float, float, float]:
    """(Mann-Whitney p, HL speedup, lower, upper) on raw values (scipy's Mann-Whitney, the exact
    Hodges-Lehmann of log values by bisection)."""
    p_value = float(stats.mannwhitneyu(baseline, speculative, alternative="two-sided").pvalue)
    shift, lo, hi = hodges_lehmann(np.log(baseline), np.log(speculative), confidence)
    return p_value, math.exp(shift), math.exp(lo), math.exp(hi)


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


def warmup_mask(
    t_start: FloatArray,
    restarts: Sequence[float],
    *,
    usable: BoolArray | None = None,
    warmup_requests: int,
    restart_requests: int | None = None,
    restart_seconds: float = 0.0,
) -> BoolArray:
    """The mechanics of `warmup_exclusion`, for given restart times; `t_start` in any order.

    Marks the first `warmup_requests` usable records, and after each restart time the first
    `restart_requests` (default: `warmup_requests`) usable records that started at or after it,
    plus every usable record that started within `restart_seconds` of it (the union of the two
    limits). `usable` defaults to every record.
    """
    t = np.asarray(t_start, dtype=np.float64)
    ok = np.ones(t.shape, dtype=bool) if usable is None else np.asarray(usable, dtype=bool)
    order = np.argsort(t, kind="stable")
    sorted_t = t[order]
    usable_at = np.flatnonzero(ok[order])  # positions, in start order, of the usable records
    sorted_mask = np.zeros(t.shape, dtype=bool)
    sorted_mask[usable_at[:warmup_requests]] = True
    per_restart = warmup_requests if restart_requests is None else restart_requests
    for restart in restarts:
        first = int(np.searchsorted(sorted_t, restart, side="left"))
        k = int(np.searchsorted(usable_at, first, side="left"))
        sorted_mask[usable_at[k : k + per_restart]] = True
        if restart_seconds > 0:
            last = int(np.searchsorted(sorted_t, restart + restart_seconds, side="left"))
            sorted_mask[usable_at[k : int(np.searchsorted(usable_at, last, side="left"))]] = True
    mask = np.zeros(t.shape, dtype=bool)
    mask[order] = sorted_mask
    return mask


def count_outliers(values: FloatArray, factor: float = 1.5) -> tuple[int, float, float]:
    """(count, low fence, high fence) of values beyond the log-IQR fences."""
    logs = np.log(values)
    q1, q3 = np.quantile(logs, [0.25, 0.75])
    iqr = q3 - q1
    low, high = q1 - factor * iqr, q3 + factor * iqr
    return int(np.sum((logs < low) | (logs > high))), math.exp(low), math.exp(high)


def _usable(e2e: FloatArray, out: FloatArray, prompt: FloatArray | None) -> npt.NDArray[np.bool_]:
    ok = np.isfinite(e2e) & (e2e > 0) & np.isfinite(out) & (out > 0)
    if prompt is not None:
        ok &= np.isfinite(prompt) & (prompt > 0)
    return ok


def adjusted_hc3(
    baseline_e2e: FloatArray,
    baseline_output_tokens: FloatArray,
    speculative_e2e: FloatArray,
    speculative_output_tokens: FloatArray,
    *,
    baseline_prompt_tokens: FloatArray | None = None,
    speculative_prompt_tokens: FloatArray | None = None,
    confidence: float = 0.95,
) -> tuple[float, float, float] | None:
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
    _ = (r2, names)
    return math.exp(-effect), math.exp(-effect - z * se), math.exp(-effect + z * se)


def _units(times: FloatArray, first: float, unit_s: float) -> IntArray:
    return np.floor((times - first) / unit_s).astype(np.int64)


def unit_counts(
    reference: tuple[FloatArray, FloatArray],
    tested: tuple[FloatArray, FloatArray],
    *,
    tolerance: float,
    unit_s: float = 60.0,
) -> UnitCounts:
    """Exact counts from raw values: each arm as (values, start times in seconds). Units are
    absolute minutes floor(t / unit_s) (the rollups' minutes), numbered from the first."""
    (r_v, r_t), (t_v, t_t) = reference, tested
    if r_v.size == 0 or t_v.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return UnitCounts(empty, empty, empty, empty)
    first = math.floor(float(min(r_t.min(), t_t.min())) / unit_s) * unit_s
    r_u, t_u = _units(r_t, first, unit_s), _units(t_t, first, unit_s)
    units = int(max(r_u.max(), t_u.max())) + 1
    key, counts = np.unique(np.stack([r_u, bin_index(r_v)]), axis=1, return_counts=True)
    q = predictable_thresholds(key[0], key[1], counts.astype(np.int64), units)
    with np.errstate(invalid="ignore"):
        x_hit = t_v / (1.0 + tolerance) > q[t_u]
        y_hit = r_v > q[r_u]
    return UnitCounts(
        n_test=np.bincount(t_u, minlength=units).astype(np.int64),
        n_ref=np.bincount(r_u, minlength=units).astype(np.int64),
        x=np.bincount(t_u[x_hit], minlength=units).astype(np.int64),
        y=np.bincount(r_u[y_hit], minlength=units).astype(np.int64),
    )


def quantile_cs(values: FloatArray, p: float, alpha: float) -> tuple[float, float]:
    """Time-uniform bounds on the p-quantile from the exact order statistics."""
    t = int(values.size)
    k_lo, k_hi = count_boundaries(t, p, alpha)
    ordered = np.sort(values)
    lower = float(ordered[k_lo - 1]) if 1 <= k_lo <= t else -math.inf
    upper = float(ordered[k_hi - 1]) if 1 <= k_hi <= t else math.inf
    return lower, upper
