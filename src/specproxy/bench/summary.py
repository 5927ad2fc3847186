"""Per-arm figures of a bench run, computed from the client's own results (pure, no I/O).

These are the quick numbers the harness prints at the end of each block; the full comparison
(bootstrap CIs, verdicts) comes from the stats job over the same rows in the store.

Arms are named (str). Each arm's throughput is over its own duration (its first send to its last
byte), since every arm runs its own stream. Goodput follows `vllm bench serve --goodput`
(vllm/benchmarks/serve.py, 0.32, `calculate_metrics`): a successful request is good when every
SLO given holds (TTFT, TPOT with 0 for a single output token, E2E latency).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from specproxy.errors import ConfigError
from specproxy.loadgen import ClientResult

__all__ = [
    "BENCH_STATISTICS",
    "GOODPUT_METRICS",
    "ArmSummary",
    "HarnessOverhead",
    "harness_overhead",
    "is_good",
    "parse_goodput",
    "speedups",
    "summarise",
]

GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vLLM's names, SLOs in milliseconds

BENCH_STATISTICS = ("median", "p99")
CONFIDENCE = 0.95


@dataclass(frozen=True, slots=True)
class ArmSummary:
    """Latency and acceptance of one arm (or of the proxy, arm None) over one block."""

    arm: str | None
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
    duration_s: float = 0.0  # the arm's first send to its last byte
    good: int | None = None  # successful requests meeting every --goodput SLO; None: no SLO
    categories: dict[str, int] = field(default_factory=dict)  # successful requests per category


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


def summarise(
    results: Iterable[ClientResult],
    *,
    order: Sequence[str] = (),
    goodput: dict[str, float] | None = None,
) -> list[ArmSummary]:
    """One summary per arm seen: those named in `order` first (in that order), then the rest by
    name, then the results of no arm."""
    by_arm: dict[str | None, list[ClientResult]] = {}
    for r in results:
        by_arm.setdefault(r.arm, []).append(r)
    rank = {name: i for i, name in enumerate(order)}

    def key(arm: str | None) -> tuple[int, int, str]:
        if arm is None:
            return (2, 0, "")
        return (0, rank[arm], arm) if arm in rank else (1, 0, arm)

    return [_summary(arm, by_arm[arm], goodput) for arm in sorted(by_arm, key=key)]


def parse_goodput(pairs: Iterable[str]) -> dict[str, float]:
    """`--goodput` as vLLM takes it: KEY:MS pairs (space- or comma-separated), KEY one of
    ttft, tpot, e2el, MS a non-negative number of milliseconds (kept in milliseconds)."""
    out: dict[str, float] = {}
    for pair in (p for item in pairs for p in item.split(",") if p.strip()):
        name, sep, value = pair.strip().partition(":")
        try:
            ms = float(value) if sep else float("nan")
        except ValueError:
            ms = float("nan")
        if name not in GOODPUT_METRICS or not ms >= 0:
            raise ConfigError(
                f"--goodput takes KEY:MS pairs with KEY one of {', '.join(GOODPUT_METRICS)} "
                f"and MS >= 0 milliseconds, got {pair.strip()!r}"
            )
        out[name] = ms
    return out


def is_good(result: ClientResult, slo_s: dict[str, float]) -> bool:
    """A successful request within every SLO (seconds); TPOT counts as 0 for one output token,
    as vLLM's goodput does."""
    if not result.ok:
        return False
    m = result.measures
    ttft = m.ttft_s if m.ttft_s is not None else m.e2e_s
    values = {"ttft": ttft, "tpot": m.tpot_s or 0.0, "e2el": m.e2e_s}
    return all(values[name] <= limit for name, limit in slo_s.items())


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


def _summary(
    arm: str | None, rows: list[ClientResult], goodput: dict[str, float] | None
) -> ArmSummary:
    ok = [r for r in rows if r.ok]
    categories: dict[str, int] = {}
    for r in ok:
        if r.category is not None:
            categories[r.category] = categories.get(r.category, 0) + 1
    start = min(r.t_start for r in rows)
    end = max(r.t_start + r.measures.e2e_s for r in rows)
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
        duration_s=end - start,
        good=sum(is_good(r, goodput) for r in ok) if goodput else None,
        categories=dict(sorted(categories.items())),
    )


def speedups(
    results: Sequence[ClientResult],
    *,
    control: str,
    treatment: str,
    seed: int = 0,
    resamples: int = 2000,
) -> dict[str, dict[str, dict[str, Any]]]:
    """Speedup = control / treatment of E2E and TPOT, median and P99, each with its bootstrap
    CI from the stats module (`value_speedup_intervals`, the stats job's own), or
    {"status": "insufficient", "n_needed": {arm: more}} while an arm lacks the samples the
    statistic's distribution-free CI needs (a P99 needs 368 per arm at 95%)."""
    from specproxy.stats.estimate.blockboot import value_speedup_intervals
    from specproxy.stats.estimate.quantile import samples_needed

    ok = [r for r in results if r.ok]
    values: dict[str, dict[str, list[float]]] = {"e2e": {}, "tpot": {}}
    for r in ok:
        if r.arm is None:
            continue
        values["e2e"].setdefault(r.arm, []).append(r.e2e_ns / 1e9)
        if r.measures.tpot_s is not None:
            values["tpot"].setdefault(r.arm, []).append(r.measures.tpot_s)
    out: dict[str, dict[str, dict[str, Any]]] = {}
    rng = np.random.default_rng(seed)
    for metric, by_arm in values.items():
        base = np.asarray(by_arm.get(control, []), dtype=np.float64)
        spec = np.asarray(by_arm.get(treatment, []), dtype=np.float64)
        if base.size == 0 or spec.size == 0:
            continue
        cis = value_speedup_intervals(
            base, spec, statistics=BENCH_STATISTICS, rng=rng, resamples=resamples
        )
        out[metric] = {}
        for stat in BENCH_STATISTICS:
            needed = {
                arm: samples_needed(stat, arr.size, CONFIDENCE)
                for arm, arr in ((control, base), (treatment, spec))
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
