"""One window's comparison computed from per-minute rollups instead of rows (pure, CPU only).

Same schema as `compare.compare_window` (documented in `stats.job`), with `"source": "rollups"`.
What rollups can give, and how:
  * speedup CIs: the time-block bootstrap over minutes (`blockboot`), the i.i.d. interval beside it
    from a per-observation Poisson bootstrap on the same histograms;
  * summaries: quantiles from the grid histogram (within half a bin, `loggrid.GRID_ERROR_BOUND`),
    the mean exact from the sums;
  * the anytime-valid tests: the same confidence sequences, whose order statistics are read off
    the histogram (`sequential.RankedArm.of_histogram`), the two-sample P99 test bounded
    conservatively inside each bin (`p99test.p99_slower_test_binned`), and the per-minute
    exceedance test on each minute's entries, counted conservatively
    (`exceedance.unit_counts_binned`);
  * outlier counts, the rank tests (Mann-Whitney, Hodges-Lehmann) and the sample-size estimate
    from each arm's pooled histogram (`binned`, within the window's grid bound);
  * the length adjustment from the window's moment rows (`adjust.adjusted_from_moments`: the
    rows' estimate; its CI bootstraps E2E's time blocks, or is the OLS one below
    `blocklength.MIN_BLOCKS` blocks); null when the store has no moments for the window (a
    store upgraded from schema v7, for its older minutes), named in `"unavailable"` then.
The design is always "split": pairs need request ids.
"""

from __future__ import annotations

import math
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm
from specproxy.stats.anytime.exceedance import BinnedUnits
from specproxy.stats.anytime.p99test import BinnedArm
from specproxy.stats.anytime.sequential import RankedArm
from specproxy.stats.anytime.verdict import anytime_valid_binned
from specproxy.stats.compare import METRIC_COLUMNS, CompareSettings, diagnose_metrics, speedup_block
from specproxy.stats.diagnosis import EngineSummary
from specproxy.stats.estimate.adjust import adjusted_from_moments
from specproxy.stats.estimate.binned import (
    binned_density_at_median,
    binned_outliers,
    binned_rank_tests,
)
from specproxy.stats.estimate.blockboot import ArmBlocks, block_speedup_intervals
from specproxy.stats.estimate.blocklength import BlockPlan
from specproxy.stats.estimate.quantile import STATISTICS
from specproxy.stats.estimate.samplesize import samples_from_densities
from specproxy.summary.grid import COARSE_FACTOR
from specproxy.summary.histogram import bin_centres, bin_lower_edges

__all__ = ["UNAVAILABLE_FROM_ROLLUPS", "compare_rollup_window"]

UNAVAILABLE_FROM_ROLLUPS: Final[tuple[str, ...]] = ()  # every statistic of a row window


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


# Bin edges widened by this relative margin: `loggrid.bin_index` rounds log(v) / d, so a value
# can sit an ulp outside the edges computed back from its bin; widening keeps the binned
# two-sample test's bound (every value inside its bin) true in floating point.
_EDGE_SLACK: Final = 1e-9
FloatArray = npt.NDArray[np.float64]


def _edges(bins: npt.NDArray[np.int64]) -> tuple[FloatArray, FloatArray]:
    """Lower and upper edges that surely hold every value of an entry at grid bin `bins`.

    The compacted tier enters a coarse bin as the fine bin at its centre
    (`loggrid.coarse_as_fine`), so an entry at that position may hold values anywhere in the
    coarse bin: its edges are the coarse bin's. A fine entry at that position gets the wider
    (still true) edges too; the conservative tests only need every value inside its bin."""
    half = COARSE_FACTOR // 2
    maybe_coarse = np.mod(bins, COARSE_FACTOR) == half
    return (
        bin_lower_edges(np.where(maybe_coarse, bins - half, bins)) * (1.0 - _EDGE_SLACK),
        bin_lower_edges(np.where(maybe_coarse, bins + half + 1, bins + 1)) * (1.0 + _EDGE_SLACK),
    )


def _arms(arm: ArmBlocks, *, units: bool = True) -> tuple[RankedArm, BinnedArm, BinnedUnits | None]:
    """The pooled histogram as order statistics (bin centres) and as bins with their true edges
    (`_edges`), and (`units`) the per-unit entries with those edges (the exceedance test; left
    out where the test does not run: over hour blocks, ~1M entries per arm in a 30-day window,
    their edges alone cost ~0.1 s a tick)."""
    bins, counts = arm.pooled()
    lower, upper = _edges(bins)
    per_unit = None
    if units:
        unit_lower, unit_upper = _edges(arm.bins)
        per_unit = BinnedUnits(arm.unit, arm.bins, unit_lower, unit_upper, arm.counts)
    return (
        RankedArm.of_histogram(bin_centres(bins), counts),
        BinnedArm(lower=lower, upper=upper, counts=counts),
        per_unit,
    )


def _secondary(base: ArmBlocks, spec: ArmBlocks, settings: CompareSettings) -> dict[str, Any]:
    """Outliers, rank tests and the sample-size estimate from the pooled histograms."""
    (b_bins, b_counts), (s_bins, s_counts) = base.pooled(), spec.pooled()
    return {
        "outliers": {
            Arm.BASELINE.value: binned_outliers(b_bins, b_counts).to_dict(),
            Arm.SPECULATIVE.value: binned_outliers(s_bins, s_counts).to_dict(),
        },
        "rank_tests": binned_rank_tests(
            b_bins, b_counts, s_bins, s_counts, settings.confidence
        ).to_dict(),
        "samples_for_5pct_median": samples_from_densities(
            binned_density_at_median(b_bins, b_counts),
            binned_density_at_median(s_bins, s_counts),
            alpha=settings.alpha,
        ),
    }


def _adjusted(
    moments: dict[Arm, FloatArray],
    plan: BlockPlan,
    settings: CompareSettings,
    rng: np.random.Generator,
) -> dict[str, Any] | None:
    """The adjusted speedup over E2E's time blocks (`plan`) from per-unit moments."""
    per_block = []
    for arm in (Arm.BASELINE, Arm.SPECULATIVE):
        units = moments[arm]
        block = np.arange(units.shape[0]) // max(plan.block_units, 1)
        sums = np.zeros((max(plan.blocks, 1), units.shape[1]))
        np.add.at(sums, block, units)
        per_block.append(sums)
    weights = (
        rng.poisson(1.0, size=(settings.resamples, per_block[0].shape[0])).astype(np.float64)
        if plan.reliable
        else None
    )
    adj = adjusted_from_moments(
        per_block[0], per_block[1], weights=weights, confidence=settings.confidence
    )
    return dict(adj.to_dict()) if adj is not None else None


def _metric_block(
    base: ArmBlocks,
    spec: ArmBlocks,
    settings: CompareSettings,
    rng: np.random.Generator,
    moments: dict[Arm, FloatArray] | None = None,
) -> dict[str, Any]:
    result = block_speedup_intervals(
        base,
        spec,
        statistics=STATISTICS,
        rng=rng,
        resamples=settings.resamples,
        confidence=settings.confidence,
    )
    iid = {k: v.iid for k, v in result.intervals.items()}
    block: dict[str, Any] = {
        "n": {Arm.BASELINE.value: base.n, Arm.SPECULATIVE.value: spec.n},
        "speedup": speedup_block(iid, base.n, spec.n, settings.confidence, result),
        "time_blocks": result.plan.to_dict(),
        "summary": {
            arm.value: {stat: _finite(blocks.point_statistic(stat)) for stat in STATISTICS}
            for arm, blocks in ((Arm.BASELINE, base), (Arm.SPECULATIVE, spec))
        },
        **_secondary(base, spec, settings),
        "adjusted": (
            _adjusted(moments, result.plan, settings, rng) if moments is not None else None
        ),
    }
    if base.n and spec.n:
        # the exceedance test needs minute units: not run while hour blocks are in the window
        minutes = base.piece_units == spec.piece_units == 1
        (rank_b, bin_b, unit_b), (rank_s, bin_s, unit_s) = (
            _arms(base, units=minutes),
            _arms(spec, units=minutes),
        )
        seq = anytime_valid_binned(
            (rank_b, rank_s),
            (bin_b, bin_s),
            alpha=settings.alpha,
            tolerance=settings.p99_tolerance,
            split=True,  # rollups are always split traffic
            minutes=(unit_b, unit_s) if unit_b is not None and unit_s is not None else None,
        )
        block["sequential"] = seq
        block["verdict"] = seq["verdict"]
    else:
        block["sequential"] = None
        block["verdict"] = "inconclusive"
    return block


def compare_rollup_window(
    arms: dict[str, dict[Arm, ArmBlocks]],
    *,
    engine: dict[Arm, EngineSummary],
    settings: CompareSettings,
    rng: np.random.Generator,
    moments: dict[Arm, FloatArray] | None = None,
) -> dict[str, Any]:
    """Everything rollups allow for one window and model; `arms[metric][arm]`, and `moments`:
    per arm the window's `rollup.MOMENT_SUMS` per time unit (units x 10, the units of
    `arms["e2e"]`), None when the store has none for it."""
    metrics = {
        metric: _metric_block(
            arms[metric][Arm.BASELINE],
            arms[metric][Arm.SPECULATIVE],
            settings,
            rng,
            moments if metric == "e2e" else None,
        )
        for metric in METRIC_COLUMNS
    }
    unavailable = [*UNAVAILABLE_FROM_ROLLUPS, *(["adjusted"] if moments is None else [])]
    return {
        "source": "rollups",
        "design": "split",
        "pairs": 0,
        "samples": {arm.value: arms["e2e"][arm].n for arm in Arm},
        "metrics": metrics,
        "unavailable": unavailable,
        "engine": {arm.value: summary.to_dict() for arm, summary in engine.items()},
        "diagnosis": diagnose_metrics(metrics, engine, tolerance=settings.p99_tolerance).to_dict(),
    }
