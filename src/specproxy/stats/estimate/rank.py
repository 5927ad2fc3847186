"""Rank tests of two arms from their histograms: Mann-Whitney U and the Hodges-Lehmann shift.

Kayenta's secondary tests. Values in one grid bin count as ties; exp(HL) of log latency is a
multiplicative speedup (control / treatment) robust to outliers. Every pairwise difference of log
values falls on a lag of bins, so the cross-correlation of the two histograms (one FFT) counts the
pairs at each lag and the median and Moses bounds are read off its cumulative sum, within one bin
width and exact over every request. Mann-Whitney's p uses the normal approximation with tie and
continuity corrections (scipy's asymptotic method).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
from scipy import stats

from specproxy.stats import result as schema
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import COARSE_FACTOR, GRID_LOG_WIDTH

__all__ = ["MAX_DENSE_BINS", "RankTests", "rank_tests"]

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Widest span of bins the Hodges-Lehmann cross-correlation is computed over at grid resolution
# (latencies from 10 us to 10 min span ~90k bins); a wider span is merged into wider bins first,
# and the estimate's error bound grows with them.
MAX_DENSE_BINS: Final = 1 << 20


@dataclass(frozen=True, slots=True)
class RankTests:
    """Mann-Whitney p-value (two-sided) and the HL speedup with its CI."""

    mann_whitney_p: float
    hl_speedup: float
    hl_lower: float
    hl_upper: float

    def to_dict(self) -> schema.RankTests:
        return {
            "mann_whitney_p": _finite(self.mann_whitney_p),
            "hl_speedup": _finite(self.hl_speedup),
            "hl_lower": _finite(self.hl_lower),
            "hl_upper": _finite(self.hl_upper),
        }


def _finite(value: float) -> float | None:
    return float(value) if math.isfinite(value) else None


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


def rank_tests(control: ArmSample, treatment: ArmSample, confidence: float = 0.95) -> RankTests:
    """Mann-Whitney and Hodges-Lehmann of control vs treatment (speedup = control / treatment)."""
    (b_bins, b_counts), (s_bins, s_counts) = control.pooled(), treatment.pooled()
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
