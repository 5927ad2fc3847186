"""The rollout gate: one window's comparison read as pass, fail or wait for a progressive-delivery
tool (Argo Rollouts' AnalysisTemplate, Flagger's MetricTemplate; deploy/kubernetes/gates/).

It reads the E2E metric's anytime-valid evidence (`stats.anytime.decision`), ratios speculative /
baseline, so it inherits their validity at every look:

- "fail": the E2E verdict is slower (its P99 or its median is slower);
- "pass": the E2E verdict is faster, or the E2E P99 and median are both shown *not slower*: the
  upper bounds of their ratios (the P99's at alpha / 2, the median's at alpha, held across the
  window's ticks) lie below 1 + p99_tolerance;
- "wait": anything else: an arm without samples in the window, or evidence that decides neither.

The gate is served in each window of `GET /api/stats` (`results[model][window]["gate"]`) and
exported as the state set `specproxy_gate{model,window,specproxy_gate}` (`stats.collector`).
Pure: no I/O.
"""

from __future__ import annotations

from specproxy.stats.result import Gate, Sequential, WindowComparison

__all__ = ["GATE_METRIC", "window_gate"]

GATE_METRIC = "e2e"


def window_gate(window: WindowComparison, tolerance: float) -> Gate:
    """The gate of one window; `tolerance`: the stats settings' p99_tolerance."""
    block = window["metrics"].get(GATE_METRIC)
    if block is None:
        return {"state": "wait", "reasons": ["no E2E comparison in this window"]}
    seq = block["sequential"]
    if seq is None:
        n = block["n"]
        counts = ", ".join(f"{arm} {count}" for arm, count in n.items())
        return {
            "state": "wait",
            "reasons": [f"an arm has no E2E samples in this window ({counts})"],
        }
    if block["verdict"] == "slower":
        return {"state": "fail", "reasons": _slower(seq)}
    if block["verdict"] == "faster":
        return {"state": "pass", "reasons": _faster(seq)}
    limit = 1.0 + tolerance
    bounds = (("P99", seq["p99_ratio_upper"]), ("median", seq["median_ratio_upper"]))
    if all(_below(upper, limit) for _, upper in bounds):
        shown = " and ".join(f"{name} ratio < {_fmt(upper)}" for name, upper in bounds)
        return {
            "state": "pass",
            "reasons": [f"E2E not slower: speculative/baseline {shown}, below {_fmt(limit)}"],
        }
    pending = "; ".join(
        f"{name} ratio upper bound {_fmt(upper)}"
        for name, upper in bounds
        if not _below(upper, limit)
    )
    return {
        "state": "wait",
        "reasons": [f"E2E inconclusive: not slower needs upper bounds < {_fmt(limit)} ({pending})"],
    }


def _below(upper: float | None, limit: float) -> bool:
    return upper is not None and upper < limit


def _slower(seq: Sequential) -> list[str]:
    reasons = []
    if seq["p99_slower"]:
        p99 = seq.get("p99")
        tests = ", ".join(p99["decided_by"]) if p99 is not None else "union_bound"
        reasons.append(
            f"E2E P99 slower (anytime-valid: {tests}); P99 ratio lower bound "
            f"{_fmt(seq['p99_ratio_lower'])}"
        )
    if seq["median_slower"]:
        reasons.append(
            f"E2E median slower: median ratio lower bound {_fmt(seq['median_ratio_lower'])} > 1"
        )
    return reasons


def _faster(seq: Sequential) -> list[str]:
    reasons = []
    p99 = seq.get("p99")
    if p99 is not None and p99["verdict"] == "faster":
        reasons.append(
            f"E2E P99 faster (anytime-valid: {', '.join(p99['decided_by'])}); P99 ratio upper "
            f"bound {_fmt(seq['p99_ratio_upper'])}"
        )
    if seq["median_faster"]:
        reasons.append(
            f"E2E median faster: median ratio upper bound {_fmt(seq['median_ratio_upper'])} < 1"
        )
    return reasons or ["E2E faster"]


def _fmt(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.3f}"
