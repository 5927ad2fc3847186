"""The row path's secondary statistics computed from a pooled grid histogram (pure, CPU only).

A window analysed from rollups (`rollupcompare`) has each arm as (bin, count) pairs on the fixed
log grid of `loggrid.py`, never its requests. What the row path computes from each request is
computed here from those pairs, each within the grid's bound (every value lies in its bin, so it
moves by at most half a bin, exp(+-d/2), when it is taken at its bin's centre; COARSE_FACTOR bins
for the compacted tier's histograms):

  * outliers (`clean.count_outliers`): the log-IQR fences from the histogram's quartiles, and
    the counts of the bins whose centre lies beyond a fence (a bin that straddles a fence is
    counted by its centre: the count can differ from the rows' by those two bins' values);
  * Mann-Whitney U (`ranktests`): pairs with the baseline value above the speculative one, values
    in one bin counted as ties (half a pair); the two-sided p from the normal approximation with
    the tie and continuity corrections, i.e. scipy's asymptotic method;
  * Hodges-Lehmann (`ranktests.hodges_lehmann`): on a uniform log grid every pairwise difference
    of log latency between the arms falls on a lag of bins, and the cross-correlation of the two
    histograms (one FFT) counts the pairs at each lag, so the median difference and the Moses
    bounds are read off its cumulative sum, within one bin width (a difference of two values
    each within half a bin): exact over every request, where the exact bisection would have to
    subsample (the row path uses this above `ranktests.HL_MAX_N` per arm too);
  * the density of log latency at the median (`samplesize`): the same Gaussian kernel and
    Silverman bandwidth, over the bin centres weighted by their counts.
"""

from __future__ import annotations

import math
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import stats

from specproxy.stats.clean import OutlierSummary
from specproxy.stats.estimate.ranktests import RankTests
from specproxy.summary.grid import COARSE_FACTOR, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_log_centres

__all__ = [
    "MAX_DENSE_BINS",
    "binned_density_at_median",
    "binned_outliers",
    "binned_rank_tests",
]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Widest span of bins the Hodges-Lehmann cross-correlation is computed over at grid resolution
# (latencies from 10 us to 10 min span ~90k bins); a wider span is merged into wider bins first,
# and the estimate's error bound grows with them.
MAX_DENSE_BINS: Final = 1 << 20


def _quantilebin_log_centres(bins: IntArray, counts: IntArray, levels: list[float]) -> FloatArray:
    """Lower order statistics at ranks floor((n-1)p), as log bin centres (bins sorted)."""
    n = int(counts.sum())
    cum = np.cumsum(counts)
    ranks = np.floor((n - 1) * np.asarray(levels))
    return bin_log_centres(bins[np.searchsorted(cum, ranks, side="right")])


def binned_outliers(bins: IntArray, counts: IntArray, factor: float = 1.5) -> OutlierSummary:
    """`clean.count_outliers` from a histogram (sorted bins, positive counts)."""
    n = int(counts.sum())
    if n < 4:
        return OutlierSummary(0, 0.0, math.nan, math.nan)
    q1, q3 = _quantilebin_log_centres(bins, counts, [0.25, 0.75])
    iqr = float(q3 - q1)
    low, high = float(q1) - factor * iqr, float(q3) + factor * iqr
    logs = bin_log_centres(bins)
    count = int(counts[(logs < low) | (logs > high)].sum())
    return OutlierSummary(count, count / n, math.exp(low), math.exp(high))


def _mann_whitney_p(
    b_bins: IntArray, b_counts: IntArray, s_bins: IntArray, s_counts: IntArray
) -> float:
    n1, n2 = float(b_counts.sum()), float(s_counts.sum())
    grid = np.union1d(b_bins, s_bins)
    b = np.zeros(grid.size)
    s = np.zeros(grid.size)
    b[np.searchsorted(grid, b_bins)] = b_counts
    s[np.searchsorted(grid, s_bins)] = s_counts
    s_below = np.cumsum(s) - s
    u1 = float(b @ (s_below + 0.5 * s))
    big_n = n1 + n2
    ties = b + s
    tie_term = float(ties @ (ties * ties - 1.0)) / (big_n * (big_n - 1.0)) if big_n > 1 else 0.0
    variance = n1 * n2 / 12.0 * ((big_n + 1.0) - tie_term)
    if not variance > 0:
        return math.nan
    u = max(u1, n1 * n2 - u1)
    z = (u - n1 * n2 / 2.0 - 0.5) / math.sqrt(variance)
    return float(min(1.0, 2.0 * stats.norm.sf(z)))


def _dense(bins: IntArray, counts: IntArray, lo: int, width: int, step: int) -> FloatArray:
    out = np.zeros(width)
    np.add.at(out, (bins - lo) // step, counts.astype(np.float64))
    return out


def _difference_counts(
    b_bins: IntArray, b_counts: IntArray, s_bins: IntArray, s_counts: IntArray
) -> tuple[FloatArray, int, int]:
    """Pair counts per lag of (baseline bin - speculative bin) in steps of `step` bins, the lag
    of index 0 (in steps), and `step`: COARSE_FACTOR when every entry is a compacted bin (all
    at coarse centres, so their lags are whole coarse bins and the FFT is 25x shorter), merged
    further only if the span exceeds `MAX_DENSE_BINS` (then lags are rounded to the step)."""
    lo = int(min(b_bins[0], s_bins[0]))
    residue = lo % COARSE_FACTOR
    coarse = bool(
        np.all(b_bins % COARSE_FACTOR == residue) and np.all(s_bins % COARSE_FACTOR == residue)
    )
    span = int(max(b_bins[-1], s_bins[-1])) - lo + 1
    step = COARSE_FACTOR if coarse else 1
    step *= max(1, math.ceil(span / step / MAX_DENSE_BINS))
    width = (span + step - 1) // step
    b = _dense(b_bins, b_counts, lo, width, step)
    s = _dense(s_bins, s_counts, lo, width, step)
    size = 1 << (2 * width - 1).bit_length()
    # conv[m] = sum_k b[k] s[width - 1 - m + k]: pairs whose lag (in steps) is m - width + 1
    conv = np.fft.irfft(np.fft.rfft(b, size) * np.fft.rfft(s[::-1], size), size)[: 2 * width - 1]
    return np.maximum(np.rint(conv), 0.0), -(width - 1), step


def binned_rank_tests(
    b_bins: IntArray,
    b_counts: IntArray,
    s_bins: IntArray,
    s_counts: IntArray,
    confidence: float = 0.95,
) -> RankTests:
    """`ranktests.rank_tests` (baseline vs speculative) from two histograms (sorted bins)."""
    if b_counts.sum() == 0 or s_counts.sum() == 0:
        return RankTests(math.nan, math.nan, math.nan, math.nan)
    p_value = _mann_whitney_p(b_bins, b_counts, s_bins, s_counts)
    pairs, lag0, step_bins = _difference_counts(b_bins, b_counts, s_bins, s_counts)
    cum = np.cumsum(pairs)
    total = float(cum[-1])  # n * m, up to the FFT's rounding of very large counts
    step = step_bins * GRID_LOG_WIDTH

    def kth(k: float) -> float:
        """The k-th smallest difference (1-based) as a log value."""
        at = min(int(np.searchsorted(cum, k, side="left")), cum.size - 1)
        return (at + lag0) * step

    n, m = float(b_counts.sum()), float(s_counts.sum())
    middle = (total + 1) / 2
    shift = kth(middle) if total % 2 else 0.5 * (kth(total / 2) + kth(total / 2 + 1))
    z = float(stats.norm.ppf(0.5 + confidence / 2.0))
    c = math.floor(total / 2.0 - z * math.sqrt(total * (n + m + 1) / 12.0))
    if c < 1:
        return RankTests(p_value, math.exp(shift), 0.0, math.inf)
    return RankTests(p_value, math.exp(shift), math.exp(kth(c)), math.exp(kth(total - c + 1)))


def binned_density_at_median(bins: IntArray, counts: IntArray) -> float:
    """`samplesize.log_density_at_median` from a histogram (sorted bins; NaN below 10 values)."""
    n = float(counts.sum())
    if n < 10:
        return math.nan
    logs = bin_log_centres(bins)
    w = counts.astype(np.float64)
    mean = float(w @ logs) / n
    sd = math.sqrt(max(float(w @ (logs - mean) ** 2) / (n - 1.0), 0.0))
    q25, median, q75 = _quantilebin_log_centres(bins, counts, [0.25, 0.5, 0.75])
    iqr = float(q75 - q25)
    spread = min(sd, iqr / 1.349) if iqr > 0 else sd
    if spread <= 0:
        return math.inf
    bandwidth = 0.9 * spread * math.pow(n, -0.2)
    kernel = np.asarray(stats.norm.pdf((logs - float(median)) / bandwidth), dtype=np.float64)
    return float(w @ kernel) / (n * bandwidth)
