"""One metric's anytime-valid verdict: two P99 tests (each direction) and the median test.

`anytime_valid` (raw values) and `anytime_valid_binned` (rollup histograms) run, each P99 test
at alpha / 2:
  * the union bound of per-arm confidence sequences (`sequential`; P99 ratio at alpha / 2,
    median ratio at alpha),
  * on split traffic (random assignment within each minute): the per-minute exceedance
    e-process (`exceedance`), once per direction: "speculative P99 > (1 + tol) x baseline P99"
    (slower) and, with the arms' roles swapped, "baseline P99 > (1 + tol) x speculative P99"
    (faster). Its level holds under ANY serial dependence across minutes (load waves, shared
    noise, a drifting split), which the i.i.d. tests' does not, and it is at least as powerful
    as the two-sample e-process (benchmarks/bench_p99power.py: +10 % P99 at sigma 0.5, one
    run per minute of 200 requests, 0.30/0.69/0.98 against 0.15/0.45/0.90 at 5k/10k/20k per arm,
    both at alpha / 3); so on split traffic it REPLACES the two-sample test.
    On rollups it needs minute units: once the window holds compacted hour blocks
    (`ArmBlocks.piece_units > 1`) it is not run at that tick (the whole-run memory keeps its
    earlier crossings); its thresholds lie on the coarse grid so rows, fine and 0.5 % rollups of
    the same minutes give the same thresholds and each tick's statistic is at most the exact
    (rows) one: every remembered crossing is a crossing of the one exact e-process.
  * on mirrored (paired) designs or values without start times: the two-sample P99 e-process
    (`p99test`) instead, once per direction;
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

from specproxy.stats.anytime.exceedance import (
    BinnedUnits,
    ExceedanceResult,
    exceedance_test,
    unit_counts,
    unit_counts_binned,
)
from specproxy.stats.anytime.p99test import (
    BinnedArm,
    P99TestResult,
    p99_slower_test,
    p99_slower_test_binned,
)
from specproxy.stats.anytime.sequential import (
    Decision,
    RankedArm,
    SequentialResult,
    compare_sequential,
    compare_sequential_ranked,
)
from specproxy.stats.result import P99Verdict, Sequential, TwoSampleP99

__all__ = ["anytime_valid", "anytime_valid_binned", "write_decision"]

FloatArray = npt.NDArray[np.float64]


def _e_process(test: P99TestResult | ExceedanceResult | None, level: float) -> TwoSampleP99:
    """One direction of an e-process test; None: not run (statistic None, never rejected)."""
    if test is None:
        return {
            "statistic": None,
            "boundary": math.log(1.0 / level),
            "rejected": False,
            "sticky": False,
        }
    rejected = test.rejected if isinstance(test, ExceedanceResult) else test.decision == "slower"
    return {
        "statistic": test.statistic if math.isfinite(test.statistic) else None,
        "boundary": test.boundary,
        "rejected": rejected,
        "sticky": False,
    }


Pair = tuple[P99TestResult, P99TestResult]
ExceedancePair = tuple[ExceedanceResult, ExceedanceResult]


def _block(
    cs: SequentialResult,
    two_sample: Pair | None,
    exceedance: ExceedancePair | None,
    *,
    level: float,
    binned: bool,
    split: bool,
) -> Sequential:
    seq = cs.to_dict()
    second = "exceedance" if split else "two_sample"
    p99: P99Verdict = {
        "verdict": "inconclusive",
        "decided_by": [],
        "level": level,
        "union_bound_slower": False,
        "union_bound_faster": False,
        "slower": _e_process(two_sample[0] if two_sample else None, level),
        "faster": _e_process(two_sample[1] if two_sample else None, level),
        "binned": binned,
        "tests": ["union_bound", second],
        "exceedance_slower": _e_process(exceedance[0] if exceedance else None, level),
        "exceedance_faster": _e_process(exceedance[1] if exceedance else None, level),
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
    each value's start time in seconds, given for split traffic only (then the second P99 test
    is the exceedance test, else the two-sample test)."""
    level = alpha / 2.0
    cs = compare_sequential(
        baseline, speculative, alpha=alpha, tolerance=tolerance, p99_alpha=level
    )
    if times is None:
        two_sample = (
            p99_slower_test(baseline, speculative, alpha=level, tolerance=tolerance),
            p99_slower_test(speculative, baseline, alpha=level, tolerance=tolerance),
        )
        return _block(cs, two_sample, None, level=level, binned=False, split=False)
    base, spec = (baseline, times[0]), (speculative, times[1])
    exceedance = (
        exceedance_test(unit_counts(base, spec, tolerance=tolerance), alpha=level),
        exceedance_test(unit_counts(spec, base, tolerance=tolerance), alpha=level),
    )
    return _block(cs, None, exceedance, level=level, binned=False, split=True)


def anytime_valid_binned(
    ranked: tuple[RankedArm, RankedArm],
    binned: tuple[BinnedArm, BinnedArm],
    *,
    alpha: float,
    tolerance: float,
    split: bool = False,
    minutes: tuple[BinnedUnits, BinnedUnits] | None = None,
) -> Sequential:
    """The `sequential` block from histograms: order statistics for the CSs (`ranked`); then,
    split (rollups): the exceedance test on per-minute entries (`minutes`; None: not run at
    this tick, e.g. hour blocks in the window), else the conservative two-sample test on the
    pooled bins (`binned`); (baseline, speculative) each."""
    level = alpha / 2.0
    cs = compare_sequential_ranked(
        ranked[0], ranked[1], alpha=alpha, tolerance=tolerance, p99_alpha=level
    )
    if not split:
        two_sample = (
            p99_slower_test_binned(binned[0], binned[1], alpha=level, tolerance=tolerance),
            p99_slower_test_binned(binned[1], binned[0], alpha=level, tolerance=tolerance),
        )
        return _block(cs, two_sample, None, level=level, binned=True, split=False)
    exceedance = None
    if minutes is not None:
        base, spec = minutes
        exceedance = (
            exceedance_test(unit_counts_binned(base, spec, tolerance=tolerance), alpha=level),
            exceedance_test(unit_counts_binned(spec, base, tolerance=tolerance), alpha=level),
        )
    return _block(cs, None, exceedance, level=level, binned=True, split=True)
