"""One metric's anytime-valid verdict: both P99 tests (each direction) and the median test.

`anytime_valid` (raw values) and `anytime_valid_binned` (rollup histograms) run
  * the union bound of per-arm confidence sequences (`sequential`; P99 ratio at alpha / 2,
    median ratio at alpha),
  * the two-sample P99 e-process (`p99test`) at alpha / 2, once per direction: "speculative P99 >
    (1 + tol) x baseline P99" (slower) and, with the arms' roles swapped, "baseline P99 >
    (1 + tol) x speculative P99" (faster),
and combine them with `sequential.decide`, the one statement of the rule. `write_decision` puts a
decision into a result's `sequential` block; `stats.hysteresis` calls it again on the whole run
with the remembered bounds and crossings.

On histograms the two-sample statistic is a conservative lower bound of the exact one (see
`p99test.p99_slower_test_binned`), so rollups can only be slower to reject than rows.

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


def _block(
    cs: SequentialResult,
    slower: P99TestResult,
    faster: P99TestResult,
    *,
    level: float,
    binned: bool,
) -> Sequential:
    seq = cs.to_dict()
    p99: P99Verdict = {
        "verdict": "inconclusive",
        "decided_by": [],
        "level": level,
        "union_bound_slower": False,
        "union_bound_faster": False,
        "slower": _two_sample(slower),
        "faster": _two_sample(faster),
        "binned": binned,
    }
    seq["p99"] = p99
    decision = dataclasses.replace(
        cs.decision,
        p99_two_sample_slower=p99["slower"]["rejected"],
        p99_two_sample_faster=p99["faster"]["rejected"],
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


def anytime_valid(
    baseline: FloatArray, speculative: FloatArray, *, alpha: float, tolerance: float
) -> Sequential:
    """The `sequential` block of a metric from both arms' positive values (exact)."""
    half = alpha / 2.0
    cs = compare_sequential(baseline, speculative, alpha=alpha, tolerance=tolerance, p99_alpha=half)
    slower = p99_slower_test(baseline, speculative, alpha=half, tolerance=tolerance)
    faster = p99_slower_test(speculative, baseline, alpha=half, tolerance=tolerance)
    return _block(cs, slower, faster, level=half, binned=False)


def anytime_valid_binned(
    ranked: tuple[RankedArm, RankedArm],
    binned: tuple[BinnedArm, BinnedArm],
    *,
    alpha: float,
    tolerance: float,
) -> Sequential:
    """The `sequential` block from histograms: order statistics for the CSs (`ranked`), bins
    for the conservative two-sample test (`binned`); (baseline, speculative) each."""
    half = alpha / 2.0
    cs = compare_sequential_ranked(
        ranked[0], ranked[1], alpha=alpha, tolerance=tolerance, p99_alpha=half
    )
    slower = p99_slower_test_binned(binned[0], binned[1], alpha=half, tolerance=tolerance)
    faster = p99_slower_test_binned(binned[1], binned[0], alpha=half, tolerance=tolerance)
    return _block(cs, slower, faster, level=half, binned=True)
