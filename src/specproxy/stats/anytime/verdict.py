"""A metric's anytime-valid evidence at one tick, from the design's samples.

Split traffic: the union bound of the arms' confidence sequences (`sequential`) and the
per-minute exceedance e-process (`exceedance`), valid under any serial dependence because it
uses only the random assignment of arms within each minute; it needs minute units, so a window
holding compacted hour blocks skips it at that tick (its memory keeps earlier crossings).
Mirrored pairs (no random assignment within a minute): the two-sample P99 e-process (`p99test`)
on the exact pair values instead; the product of the arms' e-processes stays a supermartingale
when a pair's latencies are positively dependent (same prompt), not under negative dependence.
On histograms the e-process statistics are never above the exact ones: rollups reject later.
"""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt

from specproxy.stats.anytime.decision import EProcess, Evidence, Test
from specproxy.stats.anytime.exceedance import (
    BinnedUnits,
    ExceedanceResult,
    exceedance_test,
    unit_counts,
)
from specproxy.stats.anytime.p99test import p99_slower_test
from specproxy.stats.anytime.sequential import ratio_bounds
from specproxy.stats.sample import ArmSample

__all__ = ["evidence", "exceedance_evidence"]

FloatArray = npt.NDArray[np.float64]


def _minutes(sample: ArmSample) -> bool:
    return sample.piece_units == 1 and sample.unit_s <= 60.0 and 60.0 % sample.unit_s == 0


def evidence(
    control: ArmSample,
    treatment: ArmSample,
    *,
    alpha: float,
    tolerance: float,
    pairs: tuple[FloatArray, FloatArray] | None = None,
) -> Evidence:
    """This tick's evidence on the design's samples; `pairs`: the exact values of mirrored
    pairs (control, treatment), given for the paired design only."""
    level = alpha / 2.0
    if pairs is not None:
        c, t = pairs
        s = p99_slower_test(c, t, alpha=level, tolerance=tolerance)
        f = p99_slower_test(t, c, alpha=level, tolerance=tolerance)
        slower, faster = (
            EProcess(_finite(r.statistic), r.boundary, r.decision == "slower") for r in (s, f)
        )
        return _evidence(control, treatment, slower, faster, alpha, tolerance, "two_sample")
    if control.n and treatment.n and _minutes(control) and _minutes(treatment):
        c_units, t_units = BinnedUnits.of_sample(control), BinnedUnits.of_sample(treatment)
        s_test = exceedance_test(unit_counts(c_units, t_units, tolerance=tolerance), alpha=level)
        f_test = exceedance_test(unit_counts(t_units, c_units, tolerance=tolerance), alpha=level)
        return exceedance_evidence(
            control, treatment, s_test, f_test, alpha=alpha, tolerance=tolerance
        )
    not_run = EProcess(None, math.log(1.0 / level), False)
    return _evidence(control, treatment, not_run, not_run, alpha, tolerance, "exceedance")


def exceedance_evidence(
    control: ArmSample,
    treatment: ArmSample,
    slower: ExceedanceResult,
    faster: ExceedanceResult,
    *,
    alpha: float,
    tolerance: float,
) -> Evidence:
    """Split traffic's evidence from per-minute exceedance tests run elsewhere at alpha / 2 (the
    guarded ramp carries their paths across ticks): the samples give the confidence sequences."""
    s, f = (EProcess(_finite(r.statistic), r.boundary, r.rejected) for r in (slower, faster))
    return _evidence(control, treatment, s, f, alpha, tolerance, "exceedance")


def _evidence(
    control: ArmSample,
    treatment: ArmSample,
    slower: EProcess,
    faster: EProcess,
    alpha: float,
    tolerance: float,
    test: Test,
) -> Evidence:
    level = alpha / 2.0
    return Evidence(
        p99=ratio_bounds(control, treatment, 0.99, level),
        median=ratio_bounds(control, treatment, 0.5, alpha),
        slower=slower,
        faster=faster,
        test=test,
        level=level,
        tolerance=tolerance,
        binned=True,
    )


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None
