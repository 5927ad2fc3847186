"""Why is speculation (not) paying off? The classic decision tree, on a window's live numbers.

Speculation with k drafts and mean acceptance length L ideally speeds decoding by
L / (1 + k c), c a draft pass's cost relative to a target pass; the measured speedup gives the
implied c. Branches, in order: too few samples or a restart (warm-up); no drafts, zero or low
acceptance; high load; a costly draft (implied c, and the measured step share); prefill-dominated
requests; GPU telemetry (bandwidth saturation, thermal throttling; `not_evaluated` without it);
else it works. The headline never contradicts a verdict (`_headline`). The tree in full:
docs/statistics.md.

Low acceptance knows k (`acceptance_check`): a speculative step emits L tokens on average (vLLM's
mean acceptance length, else 1 + k x its accepted/drafted rate; for a per-token acceptance alpha,
L = (1 - alpha^(k+1)) / (1 - alpha)) and costs 1 + k c target steps, so speculation can pay only
while L > 1 + k c. c is measured where the records allow it (a speculative step's median time
over a baseline step's is 1 + k c, `draft_step_share`, while the target is memory bound: not at
high load or while requests queue), else `DEFAULT_DRAFT_COST` is assumed.
The implied c is not used there: solved from the measured speedup, it makes the rule read
"speedup > 1" and says nothing about acceptance. The stats job exports L and 1 + k c as gauges
(`stats.collector`), and the `SpecProxyLowAcceptance` alert compares those, so the rule exists
here only.

Overload (`queueing`, computed by `stats.queueing`): when an arm's latency rises steeply within
the window, requests are waiting (an open-loop load above the arm's capacity grows its queue
without bound), and the comparison measures the queues, not speculation: the headline says so
first.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from specproxy.records import (
    SHORTHAND_CONTROL,
    SHORTHAND_TREATMENT,
    THERMAL_CLOCK_REASONS,
    Arm,
    EngineSample,
    GpuSample,
)
from specproxy.stats import result as schema
from specproxy.summary.engine import EngineAggregate, EngineView, aggregate_samples, as_view

__all__ = [
    "BANDWIDTH_SATURATED",
    "DEFAULT_DRAFT_COST",
    "HEADLINE_CODES",
    "HIGH_DRAFT_COST",
    "HIGH_DRAFT_STEP_SHARE",
    "HIGH_KV_CACHE_USAGE",
    "HIGH_RUNNING_REQUESTS",
    "QUEUE_GROWTH",
    "QUEUE_MIN_REQUESTS",
    "THERMAL_THROTTLE_SHARE",
    "AcceptanceCheck",
    "Diagnosis",
    "DiagnosisInput",
    "EngineSummary",
    "GpuSummary",
    "LatencyGrowth",
    "MetricVerdict",
    "Reason",
    "acceptance_check",
    "diagnose",
    "draft_step_share",
    "headline",
    "implied_draft_cost",
    "per_token_acceptance",
    "summarise_aggregate",
    "summarise_arms",
    "summarise_engine",
    "summarise_gpu",
    "tokens_per_step",
]

# c (one draft pass / one target pass) where the records do not measure it: a draft model about
# a tenth of the target's size, as the emulator's default; an n-gram proposer costs ~0, so this
# errs towards reporting low acceptance a little early for those
DEFAULT_DRAFT_COST: Final = 0.1
# Queueing: an arm's TTFT or TPOT median rising from third to third of the window's time, the last
# at least this times the first (a stationary load keeps it near 1: both are per-request rates,
# not lengths), each third holding at least QUEUE_MIN_REQUESTS requests
QUEUE_GROWTH: Final = 2.0
QUEUE_MIN_REQUESTS: Final = 30
HIGH_RUNNING_REQUESTS: Final = 32.0
HIGH_KV_CACHE_USAGE: Final = 0.9
HIGH_DRAFT_COST: Final = 0.2
HIGH_DRAFT_STEP_SHARE: Final = 0.3  # extra time of a speculative step over a target step
PREFILL_DOMINATED: Final = 0.5  # median TTFT / median E2E
BANDWIDTH_SATURATED: Final = 0.9  # busiest GPU's DRAM active (or memory copy util), window mean
# share of an arm's scrapes (with the reasons field) showing a thermal clock-event reason; above
# 0 so that one HW-slowdown flag during a clock change (dcgm_fields.h says it may appear there)
# does not fire in a window of >= 20 scrapes
THERMAL_THROTTLE_SHARE: Final = 0.05


@dataclass(frozen=True, slots=True)
class GpuSummary:
    """One arm's GPU telemetry over the window (`GpuSample`s); None: not exported."""

    samples: int = 0
    up_samples: int = 0  # scrapes in which at least one exporter answered
    gpus: int | None = None  # most GPUs read in one scrape
    utilization: float | None = None  # mean, 0..1
    memory_bandwidth: float | None = None  # mean of the busiest GPU's, 0..1
    bandwidth_source: str | None = None  # "dram_active", or "mem_copy_util" if any scrape fell back
    sm_clock_mhz: float | None = None  # mean
    temperature_c: float | None = None  # hottest reading in the window
    thermal_throttle_share: float | None = None  # share of scrapes with a thermal reason
    clock_reasons: tuple[str, ...] | None = None  # every reason seen in the window
    error: str | None = None  # the last scrape error, while no scrape succeeded

    def to_dict(self) -> schema.GpuArm:
        return {
            "samples": self.samples,
            "up_samples": self.up_samples,
            "gpus": self.gpus,
            "utilization": self.utilization,
            "memory_bandwidth": self.memory_bandwidth,
            "bandwidth_source": self.bandwidth_source,
            "sm_clock_mhz": self.sm_clock_mhz,
            "temperature_c": self.temperature_c,
            "thermal_throttle_share": self.thermal_throttle_share,
            "clock_reasons": list(self.clock_reasons) if self.clock_reasons is not None else None,
            "error": self.error,
        }


@dataclass(frozen=True, slots=True)
class EngineSummary:
    """Means over the window of one arm's scraped engine samples (None: never reported)."""

    samples: int = 0
    restarts: int = 0
    up_samples: int = 0  # scrapes that succeeded
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    num_speculative_tokens: int | None = None
    requests_running: float | None = None
    kv_cache_usage: float | None = None
    gpu: GpuSummary | None = None  # None: no GPU telemetry configured for the arm

    def to_dict(self) -> schema.EngineArm:
        return {
            "samples": self.samples,
            "restarts": self.restarts,
            "up_samples": self.up_samples,
            "acceptance_rate": self.acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "num_speculative_tokens": self.num_speculative_tokens,
            "requests_running": self.requests_running,
            "kv_cache_usage": self.kv_cache_usage,
            "gpu": self.gpu.to_dict() if self.gpu is not None else None,
        }


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None and math.isfinite(v)]
    return sum(kept) / len(kept) if kept else None


def summarise_gpu(samples: Sequence[GpuSample]) -> GpuSummary:
    """One arm's GPU samples over a window: means, the hottest reading, the throttled share."""
    up = [s for s in samples if s.up]
    known = [s for s in up if s.thermal_throttled is not None]
    reasons = sorted({r for s in up for r in s.clock_reasons or ()})
    temperatures = [s.temperature_c for s in up if s.temperature_c is not None]
    sources = {s.bandwidth_source for s in up if s.bandwidth_source is not None}
    return GpuSummary(
        samples=len(samples),
        up_samples=len(up),
        gpus=max((s.gpus for s in up), default=None),
        utilization=_mean([s.utilization for s in up]),
        memory_bandwidth=_mean([s.memory_bandwidth for s in up]),
        bandwidth_source=(
            "mem_copy_util" if "mem_copy_util" in sources else sources.pop() if sources else None
        ),
        sm_clock_mhz=_mean([s.sm_clock_mhz for s in up]),
        temperature_c=max(temperatures) if temperatures else None,
        thermal_throttle_share=(
            sum(1 for s in known if s.thermal_throttled) / len(known) if known else None
        ),
        clock_reasons=tuple(reasons) if known or reasons else None,
        error=samples[-1].error if samples and not up else None,
    )


def summarise_arms(
    engine_samples: Sequence[EngineSample] | EngineView,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None,
    *,
    since: float,
    arms: Iterable[Arm] = (SHORTHAND_CONTROL, SHORTHAND_TREATMENT),
) -> dict[Arm, EngineSummary]:
    """Every arm's summary of the samples at or after `since` (the samples, or a view of them
    that holds their aggregates, `summary.engine.EngineView`); an arm missing from `gpu_samples` has
    no GPU telemetry configured (`gpu` None)."""
    gpu = gpu_samples or {}
    view = as_view(engine_samples)
    return {
        arm: summarise_aggregate(
            view.aggregate(arm, since),
            [g for g in gpu[arm] if g.t >= since] if arm in gpu else None,
        )
        for arm in sorted({*view.arms, *gpu, *arms})
    }


def summarise_engine(
    samples: Sequence[EngineSample], gpu_samples: Sequence[GpuSample] | None = None
) -> EngineSummary:
    """Average one arm's engine samples; k is the number of per-position acceptance rates.
    `gpu_samples` (None: no GPU telemetry configured) become its `gpu` summary."""
    return summarise_aggregate(aggregate_samples(samples), gpu_samples)


def summarise_aggregate(
    agg: EngineAggregate, gpu_samples: Sequence[GpuSample] | None = None
) -> EngineSummary:
    """`summarise_engine` of the samples `agg` aggregates (`summary.engine`): means over up samples,
    each ignoring unreported (None) and non-finite values."""
    return EngineSummary(
        samples=agg.samples,
        restarts=agg.restarts,
        up_samples=agg.up_samples,
        acceptance_rate=agg.mean("acceptance_rate"),
        mean_acceptance_length=agg.mean("mean_acceptance_length"),
        num_speculative_tokens=agg.max_k,
        requests_running=agg.mean("requests_running"),
        kv_cache_usage=agg.mean("kv_cache_usage"),
        gpu=summarise_gpu(gpu_samples) if gpu_samples is not None else None,
    )


def draft_step_share(
    speculative_step_s: float | None, baseline_step_s: float | None
) -> float | None:
    """Measured draft cost: how much longer a speculative step (k drafts + verification) takes
    than a baseline (target-only) step, as a fraction of the target step; from step timing the
    records already have, independent of the speedup model."""
    if not speculative_step_s or not baseline_step_s or baseline_step_s <= 0:
        return None
    if not (math.isfinite(speculative_step_s) and math.isfinite(baseline_step_s)):
        return None
    return speculative_step_s / baseline_step_s - 1.0


def implied_draft_cost(speedup: float, acceptance_length: float, k: int) -> float | None:
    """c solving speedup = L / (1 + k*c); None when it cannot be computed."""
    if k <= 0 or not math.isfinite(speedup) or speedup <= 0 or acceptance_length <= 0:
        return None
    return (acceptance_length / speedup - 1.0) / k


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens a speculative step emits at per-token acceptance `alpha` with k drafts:
    1 + alpha + ... + alpha^k = (1 - alpha^(k+1)) / (1 - alpha) (the bonus token included)."""
    return sum(alpha**i for i in range(k + 1))


def per_token_acceptance(length: float, k: int) -> float | None:
    """The per-token acceptance alpha whose `tokens_per_step(alpha, k)` is `length` (bisection;
    it rises monotonically from 1 at alpha 0 to k + 1 at alpha 1); None outside [1, k + 1]."""
    if k <= 0 or not math.isfinite(length) or not 1.0 <= length <= k + 1.0:
        return None
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if tokens_per_step(mid, k) < length else (lo, mid)
    return (lo + hi) / 2.0


@dataclass(frozen=True, slots=True)
class AcceptanceCheck:
    """Does acceptance pay for the drafts? Tokens per speculative step against 1 + k c."""

    tokens_per_step: float  # L: vLLM's mean acceptance length, else 1 + k x accepted/drafted
    break_even: float  # 1 + k c: a speculative step's cost in target steps
    k: int
    alpha: float | None  # per-token acceptance implied by L and k
    draft_cost: float  # c
    draft_cost_source: Literal["measured", "assumed"]  # step timing, or DEFAULT_DRAFT_COST

    @property
    def pays(self) -> bool:
        return self.tokens_per_step > self.break_even

    def to_dict(self) -> schema.AcceptanceCheck:
        return {
            "tokens_per_step": self.tokens_per_step,
            "break_even_tokens_per_step": self.break_even,
            "k": self.k,
            "alpha": self.alpha,
            "draft_cost": self.draft_cost,
            "draft_cost_source": self.draft_cost_source,
            "pays": self.pays,
        }


def acceptance_check(spec: EngineSummary, step_share: float | None) -> AcceptanceCheck | None:
    """The low-acceptance rule's inputs for the speculative arm; `step_share` is the measured
    `draft_step_share` (k c, None: not measured). None without k (the engine exports no
    per-position acceptance) or without any acceptance figure."""
    k = spec.num_speculative_tokens
    if not k:
        return None
    length = spec.mean_acceptance_length
    if length is None and spec.acceptance_rate is not None:
        length = 1.0 + k * spec.acceptance_rate  # accepted per draft = k x accepted per token
    if length is None or not math.isfinite(length):
        return None
    cost = DEFAULT_DRAFT_COST if step_share is None else max(0.0, step_share) / k
    return AcceptanceCheck(
        tokens_per_step=length,
        break_even=1.0 + k * cost,
        k=k,
        alpha=per_token_acceptance(length, k),
        draft_cost=cost,
        draft_cost_source="assumed" if step_share is None else "measured",
    )


@dataclass(frozen=True, slots=True)
class LatencyGrowth:
    """One arm's latency median, first third of the window's time against its last third
    (`stats.queueing`): a steep rise says requests are queueing."""

    arm: str
    metric: str  # "TTFT" or "TPOT"
    early_s: float
    late_s: float

    @property
    def ratio(self) -> float:
        return self.late_s / self.early_s if self.early_s > 0 else math.inf

    def to_dict(self) -> schema.LatencyGrowth:
        return {
            "arm": self.arm,
            "metric": self.metric,
            "early_s": self.early_s,
            "late_s": self.late_s,
            "ratio": self.ratio,
        }

    def words(self) -> str:
        return (
            f"{self.arm} {self.metric} median {_secs(self.early_s)} -> {_secs(self.late_s)}, "
            f"{self.ratio:.1f}x"
        )


def _secs(seconds: float) -> str:
    if seconds < 0.01:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e3:.0f} ms" if seconds < 1.0 else f"{seconds:.1f} s"


@dataclass(frozen=True, slots=True)
class Reason:
    """One branch of the tree that fired: a stable code and a sentence."""

    code: str
    message: str
    detail: str | None = None  # the statistics behind the sentence, for the JSON


_NO_BOUNDS: Final = (math.nan, math.nan)


@dataclass(frozen=True, slots=True)
class MetricVerdict:
    """One metric's anytime-valid verdicts as the headline reads them (its `sequential` block);
    NaN where a number is undefined."""

    label: str  # "E2E", "TTFT", "TPOT"
    verdict: str  # the metric's verdict
    median: str = "inconclusive"  # the median part of it
    p99: str = "inconclusive"  # the P99 part of it
    median_bounds: tuple[float, float] = _NO_BOUNDS  # speculative / baseline, anytime-valid
    p99_log_e: tuple[float, float] = _NO_BOUNDS  # P99 e-process log e-values: slower, faster
    p99_boundary: float = math.nan  # their crossing level, log(2 / alpha)
    p99_ci: tuple[float, float] = _NO_BOUNDS  # fixed-sample P99 speedup interval (base / spec)
    tolerance: float = 0.05  # the P99 verdict's tolerance


@dataclass(frozen=True, slots=True)
class DiagnosisInput:
    """What the tree looks at."""

    speedup: float  # decode speedup estimate (TPOT median, else E2E median)
    speedup_lower: float
    speedup_upper: float
    enough_samples: bool
    samples_needed: int
    speculative: EngineSummary
    baseline: EngineSummary
    ttft_share: float | None = None  # median TTFT / median E2E on the speculative arm
    metric: str = "TPOT"  # label of the metric `speedup` measures (the headline names it)
    statistic: str = "median"
    e2e_verdict: str | None = None  # anytime-valid E2E verdict; None: not computed
    verdicts: tuple[MetricVerdict, ...] = ()  # every metric's verdicts (the headline names them)
    # median gap between streamed content events (one engine step each, vLLM emits one chunk
    # per step) per arm, seconds; None when not streamed
    speculative_step_s: float | None = None
    baseline_step_s: float | None = None
    # arms whose latency rose steeply within the window (`stats.queueing`); empty: none, or
    # not enough requests to tell
    queueing: tuple[LatencyGrowth, ...] = ()
    # (control, treatment): the compared arms' names, as the reasons that name an arm say them
    names: tuple[Arm, Arm] = (SHORTHAND_CONTROL, SHORTHAND_TREATMENT)


@dataclass(frozen=True, slots=True)
class Diagnosis:
    """Summary sentence plus every reason that applied."""

    summary: str
    reasons: list[Reason] = field(default_factory=list)
    implied_draft_cost: float | None = None
    draft_step_share: float | None = None  # measured: spec step / baseline step - 1
    not_evaluated: list[Reason] = field(default_factory=list)  # branches without their data
    acceptance: AcceptanceCheck | None = None  # the low-acceptance rule's inputs
    queueing: tuple[LatencyGrowth, ...] = ()  # the latency rises behind an overload headline

    def to_dict(self) -> schema.Diagnosis:
        return {
            "summary": self.summary,
            "reasons": [_reason(r) for r in self.reasons],
            "implied_draft_cost": self.implied_draft_cost,
            "draft_step_share": self.draft_step_share,
            "not_evaluated": [_reason(r) for r in self.not_evaluated],
            "acceptance": self.acceptance.to_dict() if self.acceptance is not None else None,
            "queueing": [g.to_dict() for g in self.queueing],
        }


def _reason(r: Reason) -> schema.Reason:
    return {"code": r.code, "message": r.message, "detail": r.detail}


HEADLINE_CODES: Final = frozenset(
    {"ci_ahead_of_verdict", "p99_ci_ahead_of_verdict", "slower_verdict", "working"}
)


def _parts(v: MetricVerdict, verdict: str) -> str:
    """ "E2E P99", "E2E median", "E2E median and P99": the parts of `v` with that verdict."""
    parts = [name for name, got in (("median", v.median), ("P99", v.p99)) if got == verdict]
    return f"{v.label} {' and '.join(parts)}" if parts else v.label


def _e2e(d: DiagnosisInput) -> MetricVerdict | None:
    """The E2E verdict (from `verdicts`, else `e2e_verdict` alone); None: not computed."""
    for v in d.verdicts:
        if v.label == "E2E":
            return v
    return MetricVerdict("E2E", d.e2e_verdict) if d.e2e_verdict is not None else None


def _evidence(v: MetricVerdict) -> str:
    """Where the anytime-valid tests stand, in words, for a reason."""
    lo, hi = v.median_bounds
    words = []
    if math.isfinite(lo) and math.isfinite(hi):
        words.append(
            f"its bounds on the speculative/baseline median ratio, [{lo:.3f}, {hi:.3f}], "
            "still include 1"
        )
    slower, faster = v.p99_log_e
    best = max((x for x in (slower, faster) if math.isfinite(x)), default=math.nan)
    if math.isfinite(best) and math.isfinite(v.p99_boundary):
        words.append(
            f"the P99 e-process's e-value is {math.exp(best):.3g} of the "
            f"{math.exp(v.p99_boundary):.0f} it needs"
        )
    return f" ({'; '.join(words)})" if words else ""


def _ci_ahead(d: DiagnosisInput, helps: bool, reasons: list[Reason]) -> None:
    """Why a fixed-sample interval that excludes 1 gives no verdict yet: one plain sentence,
    and the statistics behind it in `detail` (the JSON's)."""
    e2e = _e2e(d) or MetricVerdict("E2E", "inconclusive")
    direction = "above" if helps else "below"
    reasons.append(
        Reason(
            "ci_ahead_of_verdict",
            f"the 95% interval of the {d.metric} {d.statistic} speedup is {direction} 1, but "
            "there is not yet enough data for a verdict that stays valid however often you look",
            detail=f"the interval is a fixed-sample statement about this window; the "
            "anytime-valid E2E test, which stays valid however often the dashboard is read and "
            f"is therefore wider, has not crossed its bound yet{_evidence(e2e)}",
        )
    )


def _p99_ci_ahead(v: MetricVerdict, reasons: list[Reason]) -> None:
    """A P99 speedup interval that excludes 1 while the P99 verdict is inconclusive."""
    lo, hi = v.p99_ci
    if v.p99 != "inconclusive" or not (math.isfinite(lo) and math.isfinite(hi)):
        return
    if lo <= 1.0 <= hi:
        return
    c = 1.0 + v.tolerance
    slower = hi < 1.0  # speedup = baseline / speculative
    within = (hi >= 1.0 / c) if slower else (lo <= c)
    why = (
        f"the interval still allows a change within the {v.tolerance:.0%} tolerance, which the "
        "P99 verdict ignores"
        if within
        else "neither anytime-valid P99 test (each at half of alpha) has crossed its bound: they "
        "stay valid however often they are looked at, so they need more samples than one "
        f"fixed-sample interval{_evidence(dataclasses.replace(v, median_bounds=_NO_BOUNDS))}"
    )
    reasons.append(
        Reason(
            "p99_ci_ahead_of_verdict",
            f"the 95% interval of the {v.label} P99 speedup, [{lo:.2f}, {hi:.2f}], is "
            f"{'below' if slower else 'above'} 1, but the anytime-valid {v.label} P99 verdict is "
            f"inconclusive: {why}",
        )
    )


def _headline(
    d: DiagnosisInput, ci: str, helps: bool, hurts: bool, reasons: list[Reason]
) -> tuple[str, bool]:
    """The summary sentence and whether it says speculation helps. It names its metric; an E2E
    "slower" verdict wins ("hurts end to end"); a slower verdict elsewhere is named ("mixed");
    "helps" needs the quoted interval above 1 and an E2E verdict "faster" (or none computed); an
    interval that excludes 1 beside an inconclusive verdict is "no verdict yet", and a reason
    says why (docs/statistics.md lists the rules)."""
    for v in d.verdicts:
        _p99_ci_ahead(v, reasons)
    e2e = _e2e(d)
    others = [v for v in d.verdicts if v.verdict == "slower" and v.label != "E2E"]
    also = "; ".join(f"{_parts(v, 'slower')} slower" for v in others)
    if e2e is not None and e2e.verdict == "slower":
        extra = f"; also {also}" if also else ""
        return (
            f"speculation hurts end to end (anytime-valid: {_parts(e2e, 'slower')} slower"
            f"{extra}); {ci}",
            False,
        )
    if others:
        reasons.append(
            Reason(
                "slower_verdict",
                f"anytime-valid verdict: {also}. Speculation makes this latency worse although "
                "other numbers may improve; the headline does not say it helps",
            )
        )
    if e2e is not None and e2e.verdict == "faster" and (helps or not hurts):
        said = (
            f"speculation helps: {ci}"
            if helps
            else f"speculation helps end to end (anytime-valid: {_parts(e2e, 'faster')} "
            f"faster); {ci}"
        )
        return (f"mixed: {said}; but {also} (anytime-valid)", False) if others else (said, True)
    if e2e is not None and e2e.verdict == "faster":  # and the quoted interval is below 1
        tail = f"; and {also} (anytime-valid)" if others else ""
        return f"mixed: {_parts(e2e, 'faster')} faster (anytime-valid) but {ci}{tail}", False
    slower_tail = f"; {also} (anytime-valid)" if others else ""
    if (helps or hurts) and e2e is not None:  # the E2E verdict is inconclusive
        _ci_ahead(d, helps, reasons)
        lead = "no verdict yet" if helps else "leaning slower, no verdict yet"
        return f"{lead}: {ci}{slower_tail}", False
    if helps:
        return (
            (f"mixed: speculation helps: {ci}; but {also} (anytime-valid)", False)
            if others
            else (f"speculation helps: {ci}", True)
        )
    if hurts:
        return f"speculation hurts: {ci}{slower_tail}", False
    if math.isfinite(d.speedup):
        return f"no clear effect yet: {ci}{slower_tail}", False
    return ("no data yet" + (f"; {also} (anytime-valid)" if others else "")), False


def headline(d: DiagnosisInput, reasons: list[Reason]) -> str:
    """The summary sentence (`_headline`'s rules); appends its reasons (`HEADLINE_CODES`). An
    overloaded window (`d.queueing`) leads with that: its numbers measure queueing."""
    helps = math.isfinite(d.speedup_lower) and d.speedup_lower > 1.0
    hurts = math.isfinite(d.speedup_upper) and d.speedup_upper < 1.0
    ci = f"{d.metric} {d.statistic} {d.speedup:.2f}x [{d.speedup_lower:.2f}, {d.speedup_upper:.2f}]"
    summary, says_helps = _headline(d, ci, helps, hurts, reasons)
    if d.queueing:
        rises = "; ".join(g.words() for g in d.queueing)
        return (
            "overloaded: this comparison is measuring queueing, not speculation "
            f"({rises} within the window); {summary}"
        )
    if says_helps and not reasons:
        reasons.append(Reason("working", "speculation works as intended"))
    return summary


def diagnose(d: DiagnosisInput) -> Diagnosis:
    """Walk the decision tree (see the module docstring)."""
    reasons: list[Reason] = []
    spec = d.speculative
    if not d.enough_samples:
        reasons.append(
            Reason("too_few_samples", f"too few samples: {d.samples_needed} more per arm needed")
        )
    if spec.restarts or d.baseline.restarts:
        reasons.append(
            Reason(
                "warmup",
                "an engine restarted in this window; warm-up requests were excluded, "
                "but caches may still be cold",
            )
        )
    helps = math.isfinite(d.speedup_lower) and d.speedup_lower > 1.0
    cost: float | None = None
    if spec.mean_acceptance_length is not None and spec.num_speculative_tokens:
        cost = implied_draft_cost(
            d.speedup, spec.mean_acceptance_length, spec.num_speculative_tokens
        )
    no_spec_numbers = spec.acceptance_rate is None and spec.mean_acceptance_length is None
    if no_spec_numbers and spec.up_samples == 0:
        reasons.append(
            Reason(
                "no_engine_metrics",
                "the speculative engine's /metrics could not be scraped in this window; the "
                "engine-level causes cannot be checked",
            )
        )
    elif no_spec_numbers:
        reasons.append(
            Reason(
                "no_drafts",
                "no drafts proposed: the speculative engine was scraped but proposed no draft "
                "tokens in this window (its speculative-decoding counters did not move), so "
                "every step is a plain decode plus the proposer's overhead. An n-gram proposer "
                "finds nothing to copy in prompts without repeated text (e.g. random prompts); "
                "check that speculative decoding is configured if this persists",
            )
        )
    if spec.acceptance_rate is not None and spec.acceptance_rate == 0.0:
        reasons.append(
            Reason(
                "zero_acceptance",
                "acceptance is 0: drafts were proposed but every draft token was rejected, so "
                "speculation is pure overhead; the draft does not match the target (wrong or "
                "randomly initialised draft, or a tokenizer mismatch)",
            )
        )
    share = draft_step_share(d.speculative_step_s, d.baseline_step_s)
    running = spec.requests_running
    kv = spec.kv_cache_usage
    loaded = (running is not None and running >= HIGH_RUNNING_REQUESTS) or (
        kv is not None and kv >= HIGH_KV_CACHE_USAGE
    )
    # At large batch (or a growing one) a speculative step also pays for verifying k + 1 tokens
    # per sequence past the roofline knee: its time then overstates the draft's cost c.
    check = acceptance_check(spec, None if loaded or d.queueing else share)
    not_evaluated: list[Reason] = []
    accepting = spec.acceptance_rate is None or spec.acceptance_rate > 0.0
    if check is not None and accepting and not check.pays:
        reasons.append(Reason("low_acceptance", _low_acceptance(check, spec.acceptance_rate)))
    elif check is None and not no_spec_numbers and accepting:
        not_evaluated.append(
            Reason(
                "low_acceptance",
                "low acceptance not evaluated: the speculative engine exports no per-position "
                "acceptance, so k (num_speculative_tokens) is unknown, and acceptance only "
                "means something against the 1 + k c a speculative step costs",
            )
        )
    if d.queueing:
        reasons.append(
            Reason(
                "queueing",
                f"requests are queueing: {'; '.join(g.words() for g in d.queueing)} between the "
                "first and the last third of the window. A stationary load keeps these "
                "per-request medians flat; a steady rise means the arm gets more requests than "
                "it serves, so its latency grows with the queue and the comparison measures "
                "the queues, not speculation. Lower the load (or raise the arm's capacity) "
                "and compare again",
            )
        )
    if loaded:
        load = f"{running:.0f} running requests" if running is not None else "high load"
        kv_text = f", KV cache {kv:.0%} full" if kv is not None else ""
        reasons.append(
            Reason(
                "high_load",
                f"high load ({load}{kv_text}): at large batch the target is compute bound and "
                "speculation hurts; disable it above a batch size",
            )
        )
    if cost is not None and cost > HIGH_DRAFT_COST and not helps:
        reasons.append(
            Reason(
                "draft_too_costly",
                f"implied draft cost c = {cost:.2f} of a target pass (> {HIGH_DRAFT_COST}): the "
                "draft costs too much per step; use a smaller draft model, fewer speculative "
                "tokens, or prompt-lookup (n-gram) drafting if you are not already",
            )
        )
    if share is not None and share > HIGH_DRAFT_STEP_SHARE and not helps:
        reasons.append(
            Reason(
                "draft_step_share",
                f"a speculative step takes {share:.0%} longer than a target step (median gap "
                f"between streamed chunks, {(d.speculative_step_s or 0.0) * 1e3:.1f} vs "
                f"{(d.baseline_step_s or 0.0) * 1e3:.1f} ms): drafting costs more than "
                f"{HIGH_DRAFT_STEP_SHARE:.0%} of a target step; use a cheaper draft or fewer "
                "speculative tokens",
            )
        )
    if d.ttft_share is not None and d.ttft_share > PREFILL_DOMINATED and not helps:
        reasons.append(
            Reason(
                "prefill_dominated",
                f"TTFT is {d.ttft_share:.0%} of E2E: requests are prefill dominated and "
                "speculation only speeds up decoding",
            )
        )
    control, treatment = d.names
    _gpu_branches({treatment: spec.gpu, control: d.baseline.gpu}, reasons, not_evaluated)
    summary = headline(d, reasons)
    return Diagnosis(
        summary=summary,
        reasons=reasons,
        implied_draft_cost=cost,
        draft_step_share=share,
        not_evaluated=not_evaluated,
        acceptance=check,
        queueing=d.queueing,
    )


def _low_acceptance(check: AcceptanceCheck, rate: float | None) -> str:
    """The low_acceptance reason: what a step yields, what it costs, where c came from."""
    how = [f"k = {check.k}"]
    if check.alpha is not None:
        how.insert(0, f"per-token acceptance ~{check.alpha:.2f}")
    if rate is not None:
        how.insert(-1, f"{rate:.0%} of drafted tokens accepted")
    source = (
        "measured from the arms' step times"
        if check.draft_cost_source == "measured"
        else "assumed: not measured without streamed requests on both arms, nor at high load"
    )
    return (
        f"a speculative step yields {check.tokens_per_step:.2f} tokens ({', '.join(how)}), "
        f"no more than the {check.break_even:.2f} target steps it costs (1 + k c, c = "
        f"{check.draft_cost:.2f} of a target pass, {source}): acceptance is too low to pay for "
        "the drafts. The draft does not predict this traffic; suspect a domain or temperature "
        "mismatch, or use fewer speculative tokens"
    )


_BANDWIDTH = "memory_bandwidth_saturated"
_THERMAL = "thermal_throttling"
_SOURCE_WORDS = {"dram_active": "DRAM active", "mem_copy_util": "memory copy utilisation"}


def _table(arm: Arm) -> str:
    """The config table an arm's settings are in: the two-arm shorthand's, else `[arms.NAME]`."""
    return f"[{arm}]" if arm in (SHORTHAND_CONTROL, SHORTHAND_TREATMENT) else f"[arms.{arm}]"


def _gpu_branches(
    gpus: dict[str, GpuSummary | None], reasons: list[Reason], not_evaluated: list[Reason]
) -> None:
    """The two GPU branches, per arm (`gpus`: arm name -> its window summary, None when the
    arm has no dcgm-exporter configured)."""
    missing: dict[str, list[str]] = {_BANDWIDTH: [], _THERMAL: []}
    saturated: list[str] = []
    throttled: list[str] = []
    for arm, g in gpus.items():
        if g is None:
            for branch in missing.values():
                branch.append(f"the {arm} arm has no GPU telemetry ({_table(arm)} dcgm_urls)")
            continue
        if g.up_samples == 0:
            reasons.append(
                Reason(
                    "no_gpu_metrics",
                    f"the {arm} arm's dcgm-exporter could not be scraped in this window"
                    f" ({g.error or 'no scrape yet'}); its GPU branches cannot be checked",
                )
            )
            continue
        if g.memory_bandwidth is None:
            missing[_BANDWIDTH].append(
                f"the {arm} arm's exporters export neither DCGM_FI_PROF_DRAM_ACTIVE nor "
                "DCGM_FI_DEV_MEM_COPY_UTIL"
            )
        elif g.memory_bandwidth > BANDWIDTH_SATURATED:
            source = _SOURCE_WORDS.get(g.bandwidth_source or "", "memory activity")
            saturated.append(f"{arm} {g.memory_bandwidth:.0%} ({source})")
        if g.thermal_throttle_share is None:
            missing[_THERMAL].append(
                f"the {arm} arm's exporters do not export the clock-event reasons "
                "(DCGM_FI_DEV_CLOCKS_EVENT_REASONS, before DCGM 4.0 "
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS: not a default counter, add it to the "
                "exporter's CSV)"
            )
        elif g.thermal_throttle_share >= THERMAL_THROTTLE_SHARE:
            thermal = [r for r in g.clock_reasons or () if r in THERMAL_CLOCK_REASONS]
            clock = f", SM clock {g.sm_clock_mhz:.0f} MHz" if g.sm_clock_mhz is not None else ""
            temp = f", up to {g.temperature_c:.0f} °C" if g.temperature_c is not None else ""
            throttled.append(
                f"{arm} in {g.thermal_throttle_share:.0%} of scrapes "
                f"({', '.join(thermal) or 'thermal'}{clock}{temp})"
            )
    if saturated:
        reasons.append(
            Reason(
                _BANDWIDTH,
                f"memory bandwidth saturated (> {BANDWIDTH_SATURATED:.0%} of the busiest GPU's "
                f"memory cycles, window mean): {'; '.join(saturated)}. Decoding is memory bound "
                "there, and speculation's extra verification work (k+1 positions scored per "
                "step, the draft's weights and KV cache) competes for the same bandwidth, so a "
                "speculative step costs more than its compute suggests; fewer speculative "
                "tokens or a smaller batch leave it room",
            )
        )
    if throttled:
        reasons.append(
            Reason(
                _THERMAL,
                "thermal throttling: GPU clocks were cut for thermal reasons on "
                f"{'; '.join(throttled)}. Timing comparisons between the arms are confounded: a"
                " throttled arm is slower for reasons that have nothing to do with speculation;"
                " fix cooling or compare on equally cooled GPUs before trusting the verdict",
            )
        )
    for code, why in missing.items():
        if why:
            what = "memory bandwidth" if code == _BANDWIDTH else "thermal throttling"
            not_evaluated.append(Reason(code, f"{what} not evaluated for {'; '.join(why)}"))
