"""One metric's anytime-valid verdict: every P99 test (each direction) and the median test.

`anytime_valid` (raw values) and `anytime_valid_binned` (rollup histograms) run, with k the
number of P99 tests the design allows (3 for split traffic with start times, else 2):
  * the union bound of per-arm confidence sequences (`sequential`; P99 ratio at alpha / k,
    median ratio at alpha),
  * the two-sample P99 e-process (`p99test`) at alpha / k, once per direction: "speculative P99 >
    (1 + tol) x baseline P99" (slower) and, with the arms' roles swapped, "baseline P99 >
    (1 + tol) x speculative P99" (faster),
  * the per-minute exceedance e-process (`exceedance`) at alpha / k, once per direction: the
    only one of the three whose level holds under serial dependence across minutes (load waves,
    shared noise, a drifting split); it needs random assignment within each minute, so it is
    not run on mirrored (paired) designs nor on values without start times,
and combine them with `sequential.decide`, the one statement of the rule. `write_decision` puts a
decision into a result's `sequential` block; `stats.hysteresis` calls it again on the whole run
with the remembered bounds and crossings.

On histograms both e-process statistics are conservative lower bounds of the exact ones (see
`p99test.p99_slower_test_binned` and `exceedance.unit_counts_binned`), so rollups can only be
slower to reject than rows.

Mirrored (paired) designs feed both arms' members of the same pairs: the product of the arms'
e-processes stays a supermartingale when a pair's two latencies are positively dependent (the
same prompt makes both slow or both fast), because the baseline's bet gains when its latency is
low and the speculative one's when its latency is high; negative dependence is not covered.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import numpy.typing as npt

from specproxy.stats.exceedance import (
    BinnedUnits,
    ExceedanceResult,
    exceedance_test,
    unit_counts,
    unit_counts_binned,
)
from specproxy.stats.p99test import (
    BinnedArm,
    P99TestResult,
    p99_slower_test,
    p99_slower_test_binned,
)
from specproxy.stats.result import P99Verdict, Sequential, TwoSampleP99
from specproxy.stats.sequential import (
    Decision,
    RankedArm,
    SequentialResult,
    compare_sequential,
    compare_sequential_ranked,
)

__all__ = ["anytime_valid", "anytime_valid_binned", "write_decision"]

FloatArray = npt.NDArray[np.float64]


def _two_sample(test: P99TestResult) -> TwoSampleP99:
    return {
        "statistic": test.statistic if math.isfinite(test.statistic) else None,
        "boundary": test.boundary,
        "rejected": test.decision == "slower",
        "sticky": False,
    }


def _exceedance(test: ExceedanceResult | None, level: float) -> TwoSampleP99:
    if test is None:  # not run
        return {
            "statistic": None,
            "boundary": math.log(1.0 / level),
            "rejected": False,
            "sticky": False,
        }
    return {
        "statistic": test.statistic if math.isfinite(test.statistic) else None,
        "boundary": test.boundary,
        "rejected": test.rejected,
        "sticky": False,
    }


def _block(
    cs: SequentialResult,
    two_sample: tuple[P99TestResult, P99TestResult],
    exceedance: tuple[ExceedanceResult, ExceedanceResult] | None,
    *,
    level: float,
    binned: bool,
) -> Sequential:
    seq = cs.to_dict()
    tests = ["union_bound", "two_sample"] + (["exceedance"] if exceedance is not None else [])
    p99: P99Verdict = {
        "verdict": "inconclusive",
        "decided_by": [],
        "level": level,
        "union_bound_slower": False,
        "union_bound_faster": False,
        "slower": _two_sample(two_sample[0]),
        "faster": _two_sample(two_sample[1]),
        "binned": binned,
        "tests": tests,
        "exceedance_slower": _exceedance(exceedance and exceedance[0], level),
        "exceedance_faster": _exceedance(exceedance and exceedance[1], level),
    }
    seq["p99"] = p99
    decision = dataclasses.replace(
        cs.decision,
        p99_two_sample_slower=p99["slower"]["rejected"],
        p99_two_sample_faster=p99["faster"]["rejected"],
        p99_exceedance_slower=p99["exceedance_slower"]["rejected"],
        p99_exceedance_faster=p99["exceedance_faster"]["rejected"],
    )
    write_decision(seq, decision)
    return seq


def write_decision(seq: Sequential, d: Decision) -> None:
    """Set every verdict field of `seq` (and of its `p99` block) from the decision `d`."""
    seq["p99_slower"] = d.p99_verdict == "slower"
    seq["median_faster"] = d.median_faster
    seq["median_slower"] = d.median_slower
    seq["verdict"] = d.verdict
    seq["decided_by"] = d.decided_by
    p99 = seq.get("p99")
    if p99 is not None:
        p99["verdict"] = d.p99_verdict
        p99["decided_by"] = d.p99_decided_by
        p99["union_bound_slower"] = d.p99_union_slower
        p99["union_bound_faster"] = d.p99_union_faster
        p99["slower"]["rejected"] = d.p99_two_sample_slower
        p99["faster"]["rejected"] = d.p99_two_sample_faster
        if "exceedance_slower" in p99 and "exceedance_faster" in p99:
            p99["exceedance_slower"]["rejected"] = d.p99_exceedance_slower
            p99["exceedance_faster"]["rejected"] = d.p99_exceedance_faster


def anytime_valid(
    baseline: FloatArray,
    speculative: FloatArray,
    *,
    alpha: float,
    tolerance: float,
    times: tuple[FloatArray, FloatArray] | None = None,
) -> Sequential:
    """The `sequential` block of a metric from both arms' positive values (exact). `times`:
    each value's start time in seconds (split traffic only; None skips the exceedance test)."""
    level = alpha / (3.0 if times is not None else 2.0)
    cs = compare_sequential(
        baseline, speculative, alpha=alpha, tolerance=tolerance, p99_alpha=level
    )
    slower = p99_slower_test(baseline, speculative, alpha=level, tolerance=tolerance)
    faster = p99_slower_test(speculative, baseline, alpha=level, tolerance=tolerance)
    exceedance = None
    if times is not None:
        base, spec = (baseline, times[0]), (speculative, times[1])
        exceedance = (
            exceedance_test(unit_counts(base, spec, tolerance=tolerance), alpha=level),
            exceedance_test(unit_counts(spec, base, tolerance=tolerance), alpha=level),
        )
    return _block(cs, (slower, faster), exceedance, level=level, binned=False)


def anytime_valid_binned(
    ranked: tuple[RankedArm, RankedArm],
    binned: tuple[BinnedArm, BinnedArm],
    *,
    alpha: float,
    tolerance: float,
    minutes: tuple[BinnedUnits, BinnedUnits] | None = None,
) -> Sequential:
    """The `sequential` block from histograms: order statistics for the CSs (`ranked`), bins
    for the conservative two-sample test (`binned`), per-unit entries for the exceedance test
    (`minutes`, None skips it); (baseline, speculative) each."""
    level = alpha / (3.0 if minutes is not None else 2.0)
    cs = compare_sequential_ranked(
        ranked[0], ranked[1], alpha=alpha, tolerance=tolerance, p99_alpha=level
    )
    slower = p99_slower_test_binned(binned[0], binned[1], alpha=level, tolerance=tolerance)
    faster = p99_slower_test_binned(binned[1], binned[0], alpha=level, tolerance=tolerance)
    exceedance = None
    if minutes is not None:
        base, spec = minutes
        exceedance = (
            exceedance_test(unit_counts_binned(base, spec, tolerance=tolerance), alpha=level),
            exceedance_test(unit_counts_binned(spec, base, tolerance=tolerance), alpha=level),
        )
    return _block(cs, (slower, faster), exceedance, level=level, binned=True)
