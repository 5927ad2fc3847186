"""Per-arm figures of a bench run, computed from the client's own results (pure, no I/O).

These are the quick numbers the harness prints at the end of each block; the full comparison
(bootstrap CIs, verdicts) comes from the stats job over the same rows in the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specproxy.loadgen import ClientResult
from specproxy.records import Arm

__all__ = [
    "BENCH_STATISTICS",
    "ArmSummary",
    "HarnessOverhead",
    "harness_overhead",
    "speedups",
    "summarise",
]

BENCH_STATISTICS = ("median", "p99")
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class ArmSummary:
    """Latency and acceptance of one arm (or of the proxy, arm None) over one block."""

    arm: Arm | None
    n: int
    errors: int
    e2e_p50_s: float | None
    e2e_p99_s: float | None
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    tokens_per_event: float | None
    acceptance_rate: float | None  # mean of the per-request rates vLLM reported
    mean_acceptance_length: float | None
    prompt_tokens: int = 0  # totals over the successful requests (for throughput)
    output_tokens: int = 0


@dataclass(frozen=True, slots=True)
class HarnessOverhead:
    """What the harness itself cost, next to the latency it measured."""

    parse_p50_s: float
    parse_p99_s: float
    lateness_p50_s: float  # open loop only: how late requests left versus the schedule
    lateness_p99_s: float
    e2e_p50_s: float

    @property
    def parse_share(self) -> float:
        """Median parse time as a share of the median latency."""
        return self.parse_p50_s / self.e2e_p50_s if self.e2e_p50_s > 0 else 0.0


def summarise(results: Iterable[ClientResult]) -> list[ArmSummary]:
    """One summary per arm seen, speculative first."""
    by_arm: dict[Arm | None, list[ClientResult]] = {}
    for r in results:
        by_arm.setdefault(r.arm, []).append(r)
    order = {"speculative": 0, "baseline": 1, None: 2}
    return [_summary(arm, rows) for arm, rows in sorted(by_arm.items(), key=lambda i: order[i[0]])]


def harness_overhead(results: Sequence[ClientResult]) -> HarnessOverhead | None:
    ok = [r for r in results if r.ok]
    if not ok:
        return None
    parse = np.array([r.parse_ns for r in ok], dtype=np.float64) / 1e9
    late = np.array([r.lateness_ns for r in ok], dtype=np.float64) / 1e9
    e2e = np.array([r.e2e_ns for r in ok], dtype=np.float64) / 1e9
    return HarnessOverhead(
        parse_p50_s=float(np.median(parse)),
        parse_p99_s=float(np.quantile(parse, 0.99)),
        lateness_p50_s=float(np.median(late)),
        lateness_p99_s=float(np.quantile(late, 0.99)),
        e2e_p50_s=float(np.median(e2e)),
    )


def _summary(arm: Arm | None, rows: list[ClientResult]) -> ArmSummary:
    ok = [r for r in rows if r.ok]
    e2e = [r.e2e_ns / 1e9 for r in ok]
    ttft = [r.ttft_ns / 1e9 for r in ok if r.ttft_ns is not None]
    tpot = [r.measures.tpot_s for r in ok if r.measures.tpot_s is not None]
    per_event = [r.measures.tokens_per_event for r in ok if r.measures.tokens_per_event]
    return ArmSummary(
        arm=arm,
        n=len(ok),
        errors=len(rows) - len(ok),
        e2e_p50_s=_quantile(e2e, 0.5),
        e2e_p99_s=_quantile(e2e, 0.99),
        ttft_p50_s=_quantile(ttft, 0.5),
        tpot_p50_s=_quantile(tpot, 0.5),
        tokens_per_event=_mean(per_event),
        acceptance_rate=_mean([r.acceptance_rate for r in ok if r.acceptance_rate is not None]),
        mean_acceptance_length=_mean(
            [r.mean_acceptance_length for r in ok if r.mean_acceptance_length is not None]
        ),
        prompt_tokens=sum(r.measures.prompt_tokens or 0 for r in ok),
        output_tokens=sum(r.measures.output_tokens or 0 for r in ok),
    )


def speedups(
    results: Sequence[ClientResult], *, seed: int = 0, resamples: int = 2000
) -> dict[str, dict[str, dict[str, Any]]]:
    """Speedup = baseline / speculative of E2E and TPOT, median and P99, each with its bootstrap
    CI from the stats module (`value_speedup_intervals`, the stats job's own), or
    {"status": "insufficient", "n_needed": {arm: more}} while an arm lacks the samples the
    statistic's distribution-free CI needs (a P99 needs 368 per arm at 95%)."""
    from specproxy.stats.estimate.blockboot import value_speedup_intervals
    from specproxy.stats.estimate.quantile import samples_needed

    ok = [r for r in results if r.ok]
    values: dict[str, dict[Arm, list[float]]] = {"e2e": {}, "tpot": {}}
    for r in ok:
        if r.arm is None:
            continue
        values["e2e"].setdefault(r.arm, []).append(r.e2e_ns / 1e9)
        if r.measures.tpot_s is not None:
            values["tpot"].setdefault(r.arm, []).append(r.measures.tpot_s)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    rng = np.random.default_rng(seed)
    for metric, by_arm in values.items():
        base = np.asarray(by_arm.get("baseline", []), dtype=np.float64)
        spec = np.asarray(by_arm.get("speculative", []), dtype=np.float64)
        if base.size == 0 or spec.size == 0:
            continue
        cis = value_speedup_intervals(
            base, spec, statistics=BENCH_STATISTICS, rng=rng, resamples=resamples
        )
        out[metric] = {}
        for stat in BENCH_STATISTICS:
            needed = {
                arm: samples_needed(stat, arr.size, CONFIDENCE)
                for arm, arr in (("baseline", base), ("speculative", spec))
            }
            if any(needed.values()):
                out[metric][stat] = {"status": "insufficient", "n_needed": needed}
            else:
                out[metric][stat] = {"status": "ok", **cis[stat].to_dict()}
    return out


def _quantile(values: Sequence[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return float(np.mean(values)) if values else None
