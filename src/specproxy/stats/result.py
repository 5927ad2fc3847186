"""The stats job's result, typed: its JSON schema, and the one list of metrics and statistics.

The result is plain JSON-able data (served at `GET /api/stats`, stored in the history, read back
by followers and the report), so its schema is a tree of `TypedDict`s that `mypy --strict`
checks for every producer (`stats.compare`, `stats.job.tick`) and reader (collector, CLI,
report, demo). `STATISTICS` / `METRICS` are the lists everything iterates over (published in
`settings` for ui/app.js). Arms are keyed by name; a float may be null when undefined.
To add a statistic, a metric or a field, and when to bump `SCHEMA_VERSION`: docs/statistics.md.
"""

from __future__ import annotations

import json
from typing import Final, Literal, NamedTuple, NotRequired, TypedDict

from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT

__all__ = [
    "METRICS",
    "METRIC_COLUMNS",
    "SCHEMA_VERSION",
    "STATISTICS",
    "STATISTIC_LEVELS",
    "AcceptanceCheck",
    "Adjusted",
    "BandSpeedup",
    "Best",
    "BestState",
    "Comparison",
    "Conditions",
    "CrossoverGroup",
    "CrossoverResult",
    "Diagnosis",
    "EngineArm",
    "Gate",
    "GateState",
    "GpuArm",
    "Interval",
    "LatencyGrowth",
    "Metric",
    "MetricResult",
    "MetricSpec",
    "Multiplicity",
    "Outliers",
    "P99Verdict",
    "RampStatus",
    "RankTests",
    "Reason",
    "Sequential",
    "Settings",
    "Speedup",
    "Statistic",
    "StatsResult",
    "TimeBlocks",
    "TwoSampleP99",
    "Verdict",
    "WindowComparison",
    "WindowResult",
    "comparisons_of",
    "run_arms",
    "settings_lists",
    "to_json",
]

SCHEMA_VERSION: Final = 3  # 3: A/B/n (control, treatments, comparisons, multiplicity, best)

Statistic = Literal["median", "mean", "p90", "p99"]
# Every compared statistic, in display order, with its quantile level (None: not a quantile).
STATISTIC_LEVELS: Final[dict[Statistic, float | None]] = {
    "median": 0.5,
    "mean": None,
    "p90": 0.9,
    "p99": 0.99,
}
STATISTICS: Final[tuple[Statistic, ...]] = tuple(STATISTIC_LEVELS)

Metric = Literal["e2e", "ttft", "tpot"]


class MetricSpec(NamedTuple):
    """A compared latency: the record column it reads, its short label (tables, /ui) and its
    title (dashboard rows)."""

    column: str
    label: str
    title: str


METRICS: Final[dict[Metric, MetricSpec]] = {
    "e2e": MetricSpec("e2e_s", "E2E", "End-to-end latency"),
    "ttft": MetricSpec("ttft_s", "TTFT", "Time to first token"),
    "tpot": MetricSpec("tpot_s", "TPOT", "Time per output token"),
}
METRIC_COLUMNS: Final[dict[str, str]] = {name: m.column for name, m in METRICS.items()}

Verdict = Literal["faster", "slower", "inconclusive"]


class Interval(TypedDict):
    """A point estimate with its confidence bounds."""

    estimate: float | None
    lower: float | None
    upper: float | None


class Speedup(Interval):
    """statistic(baseline) / statistic(speculative); bounds are null while `insufficient`."""

    status: Literal["ok", "insufficient"]
    n_needed: dict[str, int]  # per arm: more samples the statistic needs (0 = enough)
    # `stats.blockboot`: estimate/lower/upper are the time-block interval ("block") unless the
    # window has too few time blocks ("iid"); both are kept, and why they differ materially
    method: NotRequired[Literal["block", "iid"]]
    iid: NotRequired[Interval]
    block: NotRequired[Interval | None]
    differs: NotRequired[bool]  # log-width ratio outside [1/1.25, 1.25]
    interval_note: NotRequired[str | None]


class TimeBlocks(TypedDict):
    """The block bootstrap's blocks (`stats.blocklength`): time units, units per block, why."""

    units: int
    block_units: int
    blocks: int
    politis_white: float
    reliable: bool  # at least 20 blocks


class Outliers(TypedDict):
    """Values beyond the log-IQR fences (counted, never removed)."""

    count: int
    fraction: float
    low_fence: float | None
    high_fence: float | None


class RankTests(TypedDict):
    mann_whitney_p: float | None
    hl_speedup: float | None  # Hodges-Lehmann shift, as a speedup
    hl_lower: float | None
    hl_upper: float | None


class Adjusted(Interval):
    """The E2E speedup adjusted for output (and prompt) length by regression."""

    n: int
    r_squared: float | None
    covariates: list[str]
    method: str  # "hc3" (rows), "block" or "iid" (rollups: `adjust.adjusted_from_moments`)


class TwoSampleP99(TypedDict):
    """One direction of a P99 e-process at level alpha / 2: the two-sample test
    (`stats.p99test`) or the per-minute exceedance test (`stats.exceedance`)."""

    statistic: float | None  # natural log of the e-value (two-sample: min over candidate
    # quantiles, capped at the boundary; exceedance: running max over completed minutes); None
    # while an arm is empty or the test is not run
    boundary: float  # log(2 / alpha): "rejected" once the statistic reaches it
    rejected: bool
    sticky: bool  # whole run of a running job: rejected at an earlier tick, kept (hysteresis)


class P99Verdict(TypedDict):
    """The P99 verdict (`stats.sequential.decide`): slower, faster or inconclusive, and which of
    its two tests per direction (each at level alpha / 2) rejected."""

    verdict: Verdict
    decided_by: list[str]  # "union_bound", "two_sample", "exceedance": the tests behind it
    level: float  # alpha / 2, each test's level
    union_bound_slower: bool  # p99_ratio_lower > 1 + tolerance (its CS is at level alpha / 2)
    union_bound_faster: bool  # p99_ratio_upper < 1 / (1 + tolerance)
    # two-sample e-process (mirrored pairs; not run, statistic None, on split traffic)
    slower: TwoSampleP99  # "speculative P99 > (1 + tolerance) x baseline P99"
    faster: TwoSampleP99  # "baseline P99 > (1 + tolerance) x speculative P99"
    binned: bool  # from histograms (rollups): a conservative lower bound of the statistic
    # the P99 tests of the design: ["union_bound", "exceedance"] on split traffic,
    # ["union_bound", "two_sample"] on mirrored pairs; absent in results stored before
    tests: NotRequired[list[str]]
    # per-minute exceedance e-process (`stats.exceedance`), valid under serial dependence
    # (split traffic; statistic None where not run: mirrored pairs, compacted rollup windows)
    exceedance_slower: NotRequired[TwoSampleP99]
    exceedance_faster: NotRequired[TwoSampleP99]


class Sequential(TypedDict):
    """Anytime-valid tests; ratios are speculative / baseline. The P99 ratio bounds are at level
    alpha / 2 (the P99 verdict's other half is the exceedance or two-sample test), the median's
    at alpha."""

    p99_ratio_lower: float | None
    p99_ratio_upper: float | None
    median_ratio_lower: float | None
    median_ratio_upper: float | None
    p99_slower: bool
    median_faster: bool
    median_slower: bool
    verdict: Verdict
    # what the window kept across a running job's ticks (`anytime.decision.DecisionMemory`): the
    # whole run intersects its bounds over every tick, a sliding window over the ticks within its
    # length; None/0 for a one-off `specproxy stats`
    hysteresis: str | None  # "first" | "intersected" | "reset"
    hysteresis_ticks: int  # ticks the held evidence spans
    # the tests behind `verdict`: "p99_union_bound", "p99_two_sample", "p99_exceedance",
    # "median" (absent in
    # results stored before the two-sample P99 test was wired in)
    decided_by: NotRequired[list[str]]
    p99: NotRequired[P99Verdict]


class MetricResult(TypedDict):
    """One metric of one window: both arms' summaries and every comparison."""

    n: dict[str, int]  # per arm: samples used
    speedup: dict[str, Speedup]  # per statistic (`STATISTICS`)
    summary: dict[str, dict[str, float | None]]  # per arm, per statistic; seconds
    outliers: dict[str, Outliers]  # per arm
    rank_tests: RankTests
    samples_for_5pct_median: int | None  # per arm, 80 % power
    adjusted: Adjusted | None  # e2e only
    sequential: Sequential | None  # None while an arm is empty
    verdict: Verdict
    time_blocks: NotRequired[TimeBlocks | None]  # None while an arm is empty


class GpuArm(TypedDict):
    """One arm's GPU telemetry over the window (its dcgm-exporters; `stats.diagnosis`)."""

    samples: int
    up_samples: int  # scrapes in which an exporter answered ("no GPU metrics" when 0)
    gpus: int | None
    utilization: float | None  # mean over GPUs and scrapes, 0..1
    memory_bandwidth: float | None  # busiest GPU's memory activity, window mean, 0..1
    bandwidth_source: str | None  # "dram_active" | "mem_copy_util"
    sm_clock_mhz: float | None
    temperature_c: float | None  # hottest reading
    thermal_throttle_share: float | None  # null: the reasons field is not exported
    clock_reasons: list[str] | None  # every clock-event reason seen
    error: str | None


class EngineArm(TypedDict):
    """One arm's scraped engine metrics over the window."""

    samples: int
    restarts: int
    up_samples: int  # scrapes that succeeded ("no metrics" vs "no drafts proposed")
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    num_speculative_tokens: int | None
    requests_running: float | None
    kv_cache_usage: float | None
    gpu: NotRequired[GpuArm | None]  # null: no GPU telemetry configured for the arm


class Reason(TypedDict):
    code: str
    message: str  # one plain sentence
    detail: str | None  # the statistics behind it, where the sentence leaves them out


class AcceptanceCheck(TypedDict):
    """The low-acceptance rule's inputs (`stats.diagnosis.acceptance_check`): speculation can
    pay only while tokens_per_step > break_even_tokens_per_step = 1 + k x draft_cost."""

    tokens_per_step: float  # vLLM's mean acceptance length, else 1 + k x accepted/drafted
    break_even_tokens_per_step: float
    k: int
    alpha: float | None  # per-token acceptance implied by tokens_per_step and k
    draft_cost: float  # c, one draft pass / one target pass
    draft_cost_source: Literal["measured", "assumed"]
    pays: bool


class LatencyGrowth(TypedDict):
    """One arm's median, the window's first third against its last (`stats.queueing`)."""

    arm: str
    metric: str  # "TTFT" | "TPOT"
    early_s: float
    late_s: float
    ratio: float


class Diagnosis(TypedDict):
    summary: str
    reasons: list[Reason]
    implied_draft_cost: float | None
    # measured draft cost: speculative step / baseline step - 1 (median streamed-chunk gaps)
    draft_step_share: NotRequired[float | None]
    # branches that could not be checked for lack of their data (e.g. no GPU telemetry)
    not_evaluated: NotRequired[list[Reason]]
    # null: no k or no acceptance figure (absent in results stored before 12-02)
    acceptance: NotRequired[AcceptanceCheck | None]
    queueing: NotRequired[list[LatencyGrowth]]  # non-empty: overloaded, the headline says so


GateState = Literal["pass", "fail", "wait"]


class Gate(TypedDict):
    """A rollout gate on one window (`stats.gate`), for Argo Rollouts / Flagger: "fail" when the
    E2E verdict is slower, "pass" when it is faster or the E2E median and P99 are shown not
    slower than 1 + p99_tolerance, "wait" otherwise; `reasons` says which, in words."""

    state: GateState
    reasons: list[str]


class WindowComparison(TypedDict):
    """The comparison of the arms over one window of one model (`stats.compare`)."""

    design: Literal["split", "paired"]  # paired when mirrored pairs >= primary requests
    pairs: int
    samples: dict[str, int]  # per arm: usable requests after warm-up exclusion
    metrics: dict[str, MetricResult]  # per metric (`METRICS`)
    engine: dict[str, EngineArm]  # per arm
    diagnosis: Diagnosis
    unavailable: NotRequired[list[str]]  # statistics without their data ("adjusted")


class Comparison(WindowComparison):
    """One treatment against the control over one window (A/B/n, `WindowResult.comparisons`)."""

    treatment: str
    excluded_warmup: dict[str, int]  # per arm of the comparison
    gate: NotRequired[Gate]
    # speedups by condition and the crossover (the whole-run window of all models, from its
    # condition summaries: the store's keys, or a small run's rows keyed alike)
    conditions: NotRequired[Conditions | None]


class Multiplicity(TypedDict):
    """How the family-wise error of the faster/slower verdicts over m treatments stays <= alpha:
    Bonferroni, each comparison's anytime-valid tests at alpha / m (docs/statistics.md)."""

    method: Literal["bonferroni"]
    treatments: int  # m
    alpha: float  # the family's (stats.alpha)
    alpha_per_comparison: float  # alpha / m: the level of every verdict and `Best`


BestState = Literal["winner", "no_winner_yet", "single"]


class Best(TypedDict):
    """Which treatment leads on the E2E median speedup (`stats.best`)."""

    metric: str  # "e2e"
    statistic: str  # "median"
    state: BestState
    leader: str | None
    runner_up: str | None
    speedups: dict[str, float | None]  # per treatment: speedup over the control (None: too few)
    # speedup(leader) / speedup(runner-up) = median(runner-up) / median(leader), block bootstrap
    # on the same time blocks, at the displayed confidence
    margin: Interval | None
    separated_from: list[str]  # treatments the leader is shown faster than (at `level`)
    level: float  # alpha / m
    reason: str


class BandSpeedup(TypedDict):
    """The speedup of one band of one condition (`stats.segments`): "too_little_data" (every
    number None) while an arm holds fewer than `Conditions.min_band_requests` in it."""

    band: str
    n: dict[str, int]  # {"control": .., "treatment": ..}
    status: Literal["ok", "too_little_data"]
    speedup: float | None
    lower: float | None
    upper: float | None
    # load bands: the mean calls in flight of the band's requests, both arms (where the
    # speedup was measured: "speedup vs load"); absent for the other conditions
    load: NotRequired[float]


class CrossoverGroup(TypedDict):
    load: float  # the group's mean load
    speedup: float
    n: dict[str, int]


class CrossoverResult(TypedDict):
    """Where the speedup crosses 1 against load (`stats.estimate.crossover`): `load` None
    unless status is "ok"; a bound None lies beyond the observed range."""

    status: Literal["ok", "helps_throughout", "costs_throughout", "too_little_data"]
    load: float | None
    lower: float | None
    upper: float | None
    confidence: float
    observed: list[float] | None  # [lowest, highest] group mean load
    speedup_below: float | None
    speedup_above: float | None
    groups: list[CrossoverGroup]
    block_units: int


class Conditions(TypedDict):
    """Conditional speedups of a window (issue 26): per condition dimension ("load", "prompt",
    "output", "temperature", "category") and metric its bands; per metric the crossover load;
    `summary` says the TPOT crossover in words (None: no data for it)."""

    statistic: str  # the compared statistic of every band ("median")
    min_band_requests: int
    load: str  # the record field the load bands and the crossover read
    segments: dict[str, dict[str, list[BandSpeedup]]]
    crossover: dict[str, CrossoverResult]
    summary: str | None
    # the span they cover: None for the whole run (a run read as rows), else the last seconds
    # of it (a run read from its summaries: the conditions' rollups are kept an hour)
    window_s: NotRequired[float | None]


class WindowResult(WindowComparison):
    """One window of one model (or of all models), as the job publishes it (`stats.job`). Its
    comparison fields are the control against the first treatment (the two-arm result as it
    always was); `comparisons` holds every treatment's (the first's repeats those fields)."""

    window_s: float | None  # None: the whole run
    excluded_warmup: dict[str, int]  # per arm: usable requests left out as warm-up
    # where its samples came from: "rows" (a small window, finer time units, mirrored pairs)
    # or "summaries" (the store's per-minute rollups and compacted blocks)
    source: NotRequired[Literal["rows", "summaries"]]
    unit_s: NotRequired[float]  # its time unit (bootstrap blocks hold whole units)
    span: NotRequired[list[float]]  # [start, end) of its units, Unix time
    grid_error_bound: NotRequired[float]  # worst relative error of a bound from the histograms
    gate: NotRequired[Gate]  # the rollout gate (absent in results stored before 2026-12-02)
    # A/B/n (schema 3; absent before): the arms' roles, every treatment's comparison, the
    # multiplicity rule and the best-configuration answer
    control: NotRequired[str]
    treatments: NotRequired[list[str]]
    comparisons: NotRequired[dict[str, Comparison]]  # per treatment, the first included
    multiplicity: NotRequired[Multiplicity]
    best: NotRequired[Best]
    # speedups by condition and the crossover load: the whole-run window of all models read from
    # rows only (None elsewhere; absent in results stored before 2026-12-04)
    conditions: NotRequired[Conditions | None]


class Settings(TypedDict):
    """The knobs the result was computed with, and the lists its readers iterate over."""

    resamples: int
    confidence: float
    alpha: float
    p99_tolerance: float
    warmup_requests: int
    seed: int
    restart_warmup_requests: NotRequired[int]  # scrape.warmup_requests (absent before 11-29)
    restart_warmup_seconds: NotRequired[float]  # scrape.warmup_seconds (likewise)
    windows_s: NotRequired[list[float | None]]  # stats.windows_s (None: the whole run)
    statistics: NotRequired[list[str]]  # `STATISTICS` (absent in results stored before)
    metrics: NotRequired[dict[str, dict[str, str]]]  # `METRICS`: {name: {column, label, title}}


class RampStatus(TypedDict):
    """One ramped treatment arm in the guarded ramp (`stats.job.ramp`): the leader moves the
    ramp each interval just before it computes, so a result carries the moves up to its own."""

    step: int  # 1-based step of the schedule the arm is at; 0: cut by a guard, or off it
    moves: dict[str, int]  # start | step | cut -> how many this leader made (dry_run: decided)
    dry_run: bool
    last_move: NotRequired[str]  # the newest decision: start | step | cut | hold
    last_why: NotRequired[str]
    # how far behind now the guards have read the step's requests (> 0 while a new leader
    # replays the step), and the requests that landed too late for the per-minute e-processes
    behind_s: NotRequired[float]
    late: NotRequired[int]


class StatsResult(TypedDict):
    """The whole result of one stats run (`GET /api/stats`)."""

    schema_version: int
    run_id: str
    computed_at: float  # Unix time
    duration_s: float
    window_end: float  # Unix time; windows are [window_end - w, window_end]
    data_horizon: NotRequired[float | None]  # newest data seen (rows: last t_start; rollups:
    # the end of the last minute holding data); None while the store is empty
    lag_s: NotRequired[float | None]  # computed_at - data_horizon, never below 0
    # usable requests stamped more than stats.future_skew_s after now (a clock stepped back, a
    # replica's clock running fast): in no window; and the newest such stamp (None: none)
    future_rows: NotRequired[int]
    future_newest: NotRequired[float | None]
    settings: Settings
    results: dict[str, dict[str, WindowResult]]  # model or "all" -> window label -> result
    ramp: NotRequired[dict[str, RampStatus]]  # [ramp] enabled: each ramped arm, by name
    # A/B/n: the configured arms' free-form labels (`[arms.NAME] labels`), arms with any only
    arm_labels: NotRequired[dict[str, dict[str, str]]]


def comparisons_of(window: WindowResult) -> dict[str, WindowComparison]:
    """Every treatment's comparison in a window, by treatment: its `comparisons`, else (two
    arms, or a result stored before schema 3) the window itself under its one treatment."""
    many = window.get("comparisons")
    if many:
        return dict(many)
    treatments = window.get("treatments")
    if treatments:
        name = treatments[0]
    else:
        control = window.get("control", SHORTHAND_CONTROL)  # results before A/B/n: shorthand
        others = [arm for arm in window["samples"] if arm != control]
        name = others[0] if others else SHORTHAND_TREATMENT
    return {name: window}


def run_arms(result: StatsResult | None) -> tuple[str, tuple[str, ...]] | None:
    """The (control, treatments) a stored result compared (schema 3: every window names them);
    None for no result, or one stored before A/B/n (its arms are the shorthand's)."""
    if result is None:
        return None
    for per_window in result["results"].values():
        for window in per_window.values():
            control, treatments = window.get("control"), window.get("treatments")
            if control is not None and treatments:
                return control, tuple(treatments)
    return None


def settings_lists() -> tuple[list[str], dict[str, dict[str, str]]]:
    """The `statistics` and `metrics` entries of `Settings`, from `STATISTICS` and `METRICS`."""
    return list(STATISTICS), {name: m._asdict() for name, m in METRICS.items()}


def to_json(result: StatsResult, *, indent: int | None = None) -> str:
    """The result as JSON text (what `/api/stats` and `specproxy stats --json` print)."""
    return json.dumps(result, indent=indent)
