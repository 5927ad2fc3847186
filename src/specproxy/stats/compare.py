"""One complete comparison of the two arms over one window: every estimate, test and reason.

`compare_window` is pure: it takes per-arm column arrays that are already restricted to the
window and model (and stripped of warm-up records, see `clean.warmup_mask`), engine summaries and
a Generator, and returns a `result.WindowComparison` (the schema is `specproxy.stats.result`).

Design choice: when at least as many complete mirrored pairs exist as primary requests on the
smaller arm (mirror fraction >= 50 %), the speedup CIs use the paired bootstrap over pairs;
otherwise they use the split bootstrap over primary (non-shadow) requests. Rank tests and the
length adjustment always use the primary requests, whose arm was chosen at random.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm
from specproxy.stats.anytime.verdict import anytime_valid
from specproxy.stats.clean import count_outliers, usable_mask
from specproxy.stats.diagnosis import (
    HEADLINE_CODES,
    Diagnosis,
    DiagnosisInput,
    EngineSummary,
    MetricVerdict,
    Reason,
    diagnose,
    headline,
)
from specproxy.stats.estimate.adjust import adjusted_speedup
from specproxy.stats.estimate.binned import binned_rank_tests
from specproxy.stats.estimate.blockboot import (
    ArmBlocks,
    BlockBootstrapResult,
    block_speedup_intervals,
)
from specproxy.stats.estimate.blocklength import unit_seconds
from specproxy.stats.estimate.bootstrap import (
    DEFAULT_RESAMPLES,
    Interval,
    paired_speedup_intervals,
    split_speedup_intervals,
)
from specproxy.stats.estimate.quantile import STATISTICS, point_statistic, samples_needed
from specproxy.stats.estimate.ranktests import HL_MAX_N, rank_tests
from specproxy.stats.estimate.samplesize import samples_for_median_change
from specproxy.stats.result import (
    METRIC_COLUMNS,
    METRICS,
    MetricResult,
    P99Verdict,
    Speedup,
    TimeBlocks,
    WindowComparison,
)
from specproxy.stats.result import Interval as IntervalResult
from specproxy.stats.result import RankTests as RankTestsResult
from specproxy.summary.histogram import grid_histogram

if TYPE_CHECKING:
    from specproxy.config import StatsConfig

__all__ = [
    "METRIC_COLUMNS",
    "REQUIRED_COLUMNS",
    "CompareSettings",
    "compare_window",
    "diagnose_metrics",
    "refresh_headline",
    "speedup_block",
]

FloatArray = npt.NDArray[np.float64]
ArmArrays = dict[str, npt.NDArray[Any]]
DEFAULT_P99_TOLERANCE: Final = 0.05

REQUIRED_COLUMNS: Final[tuple[str, ...]] = (
    "t_start",
    "model",
    "status",
    "error_kind",
    "disconnected",
    "shadow",
    "pair_id",
    *METRIC_COLUMNS.values(),
    "prompt_tokens",
    "output_tokens",
    "mean_gap_s",
)


@dataclass(frozen=True, slots=True)
class CompareSettings:
    """Knobs of one comparison (from `StatsConfig`)."""

    resamples: int = DEFAULT_RESAMPLES
    confidence: float = 0.95
    alpha: float = 0.05
    p99_tolerance: float = DEFAULT_P99_TOLERANCE

    @classmethod
    def from_config(cls, stats_cfg: StatsConfig) -> CompareSettings:
        return cls(
            resamples=stats_cfg.resamples,
            confidence=stats_cfg.confidence,
            alpha=stats_cfg.alpha,
            p99_tolerance=stats_cfg.p99_tolerance,
        )


def _positive(values: npt.NDArray[Any]) -> FloatArray:
    v = np.asarray(values, dtype=np.float64)
    return v[np.isfinite(v) & (v > 0)]


def _positive_times(values: npt.NDArray[Any], times: npt.NDArray[Any]) -> FloatArray:
    """The start times of the values `_positive` keeps."""
    v = np.asarray(values, dtype=np.float64)
    return np.asarray(times, dtype=np.float64)[np.isfinite(v) & (v > 0)]


def _time_blocks(
    intervals: dict[str, Interval],
    values: tuple[FloatArray, FloatArray],
    times: tuple[FloatArray, FloatArray],
    settings: CompareSettings,
    rng: np.random.Generator,
) -> BlockBootstrapResult | None:
    """Block bootstrap over time units of the window (see `blockboot`); the i.i.d. intervals
    already computed are kept as its i.i.d. half. None when an arm is empty."""
    b_t, s_t = times
    if b_t.size == 0 or s_t.size == 0:
        return None
    first = float(min(b_t.min(), s_t.min()))
    unit = unit_seconds(float(max(b_t.max(), s_t.max())) - first)
    t0 = math.floor(first / unit) * unit  # minute units coincide with the rollups' minutes
    units = int((float(max(b_t.max(), s_t.max())) - t0) // unit) + 1
    arms = [
        ArmBlocks.from_values(np.floor((t - t0) / unit).astype(np.int64), v, units)
        for v, t in zip(values, times, strict=True)
    ]
    return block_speedup_intervals(
        arms[0],
        arms[1],
        statistics=list(intervals),
        rng=rng,
        resamples=settings.resamples,
        confidence=settings.confidence,
        estimates={k: v.estimate for k, v in intervals.items()},
        iid=intervals,
    )


def _pairs(base: ArmArrays, spec: ArmArrays) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.intp]]:
    """Indices into each arm of the records sharing a pair id."""

    def ids(arrays: ArmArrays) -> tuple[npt.NDArray[Any], npt.NDArray[np.intp]]:
        raw = arrays.get("pair_id")
        if raw is None or len(raw) == 0:
            return np.array([], dtype=str), np.array([], dtype=np.intp)
        where = np.array([p is not None for p in raw], dtype=bool)
        index = np.flatnonzero(where)
        return np.asarray(raw[where]).astype(str), index

    b_ids, b_index = ids(base)
    s_ids, s_index = ids(spec)
    _, bi, si = np.intersect1d(b_ids, s_ids, assume_unique=False, return_indices=True)
    return b_index[bi], s_index[si]


def _subset(arrays: ArmArrays, mask: npt.NDArray[Any]) -> ArmArrays:
    return {k: np.asarray(v)[mask] for k, v in arrays.items()}


def speedup_block(
    intervals: dict[str, Interval],
    n_b: int,
    n_s: int,
    confidence: float,
    blocks: BlockBootstrapResult | None,
) -> dict[str, Speedup]:
    block: dict[str, Speedup] = {}
    for stat, interval in intervals.items():
        timed = blocks.intervals[stat] if blocks is not None else None
        needed = {
            Arm.BASELINE.value: samples_needed(stat, n_b, confidence),
            Arm.SPECULATIVE.value: samples_needed(stat, n_s, confidence),
        }
        if any(needed.values()):
            block[stat] = {
                "status": "insufficient",
                "n_needed": needed,
                "estimate": None,
                "lower": None,
                "upper": None,
            }
        else:
            shown = _typed(timed.interval if timed is not None else interval)
            block[stat] = {
                "status": "ok",
                "n_needed": needed,
                "estimate": shown["estimate"],
                "lower": shown["lower"],
                "upper": shown["upper"],
            }
        block[stat]["method"] = timed.reported if timed is not None else "iid"
        block[stat]["iid"] = _typed(interval)
        block[stat]["block"] = _typed(timed.block) if timed is not None else None
        block[stat]["differs"] = timed.differs if timed is not None else False
        block[stat]["interval_note"] = timed.reason if timed is not None else None
    return block


def time_blocks_result(blocks: BlockBootstrapResult | None) -> TimeBlocks | None:
    if blocks is None:
        return None
    plan = blocks.plan
    return {
        "units": plan.units,
        "block_units": plan.block_units,
        "blocks": plan.blocks,
        "politis_white": round(plan.politis_white, 3),
        "reliable": plan.reliable,
    }


def _typed(interval: Interval) -> IntervalResult:
    return {
        "estimate": _finite(interval.estimate),
        "lower": _finite(interval.lower),
        "upper": _finite(interval.upper),
    }


def _metric_block(
    metric: str,
    primary: tuple[ArmArrays, ArmArrays],
    paired: tuple[FloatArray, FloatArray, FloatArray] | None,
    settings: CompareSettings,
    rng: np.random.Generator,
) -> MetricResult:
    column = METRIC_COLUMNS[metric]
    base = _positive(primary[0][column])
    spec = _positive(primary[1][column])
    times = (
        _positive_times(primary[0][column], primary[0]["t_start"]),
        _positive_times(primary[1][column], primary[1]["t_start"]),
    )
    if paired is not None:
        b_used, s_used, pair_t = paired
        times = (pair_t, pair_t)  # both members of a pair in the same time unit
        intervals = paired_speedup_intervals(
            b_used,
            s_used,
            statistics=STATISTICS,
            rng=rng,
            resamples=settings.resamples,
            confidence=settings.confidence,
        )
    else:
        b_used, s_used = base, spec
        intervals = split_speedup_intervals(
            base,
            spec,
            statistics=STATISTICS,
            rng=rng,
            resamples=settings.resamples,
            confidence=settings.confidence,
        )
    blocks = _time_blocks(intervals, (b_used, s_used), times, settings, rng)
    block: MetricResult = {
        "n": {Arm.BASELINE.value: int(b_used.size), Arm.SPECULATIVE.value: int(s_used.size)},
        "speedup": speedup_block(intervals, b_used.size, s_used.size, settings.confidence, blocks),
        "time_blocks": time_blocks_result(blocks),
        "summary": {
            arm.value: {stat: _finite(point_statistic(v, stat)) for stat in STATISTICS}
            for arm, v in ((Arm.BASELINE, b_used), (Arm.SPECULATIVE, s_used))
        },
        "outliers": {
            Arm.BASELINE.value: count_outliers(b_used).to_dict(),
            Arm.SPECULATIVE.value: count_outliers(s_used).to_dict(),
        },
        "rank_tests": _rank_tests(base, spec, rng, settings.confidence),
        "samples_for_5pct_median": samples_for_median_change(base, spec, alpha=settings.alpha),
        "adjusted": None,
        "sequential": None,
        "verdict": "inconclusive",
    }
    if b_used.size and s_used.size:
        seq = anytime_valid(
            b_used,
            s_used,
            alpha=settings.alpha,
            tolerance=settings.p99_tolerance,
            times=None if paired is not None else times,  # the exceedance test needs a split
        )
        block["sequential"] = seq
        block["verdict"] = seq["verdict"]
    if metric == "e2e":
        b_rows, s_rows = primary
        adj = adjusted_speedup(
            np.asarray(b_rows["e2e_s"], dtype=np.float64),
            np.asarray(b_rows["output_tokens"], dtype=np.float64),
            np.asarray(s_rows["e2e_s"], dtype=np.float64),
            np.asarray(s_rows["output_tokens"], dtype=np.float64),
            baseline_prompt_tokens=np.asarray(b_rows["prompt_tokens"], dtype=np.float64),
            speculative_prompt_tokens=np.asarray(s_rows["prompt_tokens"], dtype=np.float64),
            confidence=settings.confidence,
        )
        block["adjusted"] = adj.to_dict() if adj is not None else None
    return block


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _rank_tests(
    base: FloatArray, spec: FloatArray, rng: np.random.Generator, confidence: float
) -> RankTestsResult:
    """Exact up to `HL_MAX_N` values per arm; above, from the grid histograms of every value
    (`binned`: within a 0.02 % bin instead of the exact bisection's 20k-value subsample, and
    ~20x cheaper: 0.1 s per call at 21k values per arm)."""
    if max(base.size, spec.size) <= HL_MAX_N:
        return rank_tests(base, spec, rng, confidence).to_dict()
    return binned_rank_tests(*grid_histogram(base), *grid_histogram(spec), confidence).to_dict()


def compare_window(
    arrays: dict[Arm, ArmArrays],
    *,
    engine: dict[Arm, EngineSummary],
    settings: CompareSettings,
    rng: np.random.Generator,
) -> WindowComparison:
    """Everything for one window and model (schema: `stats.result.WindowComparison`)."""
    base_all = _subset(arrays[Arm.BASELINE], usable_mask(arrays[Arm.BASELINE]))
    spec_all = _subset(arrays[Arm.SPECULATIVE], usable_mask(arrays[Arm.SPECULATIVE]))
    primary = (
        _subset(base_all, ~np.asarray(base_all["shadow"], dtype=bool)),
        _subset(spec_all, ~np.asarray(spec_all["shadow"], dtype=bool)),
    )
    pair_b, pair_s = _pairs(base_all, spec_all)
    n_primary = min(len(primary[0]["t_start"]), len(primary[1]["t_start"]))
    design: Literal["split", "paired"] = (
        "paired" if pair_b.size > 0 and pair_b.size >= n_primary else "split"
    )
    metrics: dict[str, MetricResult] = {}
    for metric, column in METRIC_COLUMNS.items():
        paired: tuple[FloatArray, FloatArray, FloatArray] | None = None
        if design == "paired":
            b = np.asarray(base_all[column], dtype=np.float64)[pair_b]
            s = np.asarray(spec_all[column], dtype=np.float64)[pair_s]
            t = np.minimum(
                np.asarray(base_all["t_start"], dtype=np.float64)[pair_b],
                np.asarray(spec_all["t_start"], dtype=np.float64)[pair_s],
            )
            ok = np.isfinite(b) & np.isfinite(s) & (b > 0) & (s > 0)
            paired = (b[ok], s[ok], t[ok])
        metrics[metric] = _metric_block(metric, primary, paired, settings, rng)
    diagnosis = diagnose_metrics(
        metrics,
        engine,
        steps=(_median_step(primary[0]), _median_step(primary[1])),
        tolerance=settings.p99_tolerance,
    )
    return {
        "design": design,
        "pairs": int(pair_b.size),
        "samples": {
            Arm.BASELINE.value: len(base_all["t_start"]),
            Arm.SPECULATIVE.value: len(spec_all["t_start"]),
        },
        "metrics": metrics,
        "engine": {arm.value: summary.to_dict() for arm, summary in engine.items()},
        "diagnosis": diagnosis.to_dict(),
    }


def _median_step(arrays: ArmArrays) -> float | None:
    """Median per-request mean gap between streamed content events (one engine step each)."""
    gaps = arrays.get("mean_gap_s")
    if gaps is None:
        return None
    v = np.asarray(gaps, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    return float(np.median(v)) if v.size else None


def _metric_verdicts(metrics: dict[str, Any], tolerance: float) -> tuple[MetricVerdict, ...]:
    """Every metric's anytime-valid verdicts as the headline reads them."""
    out = []
    for name, block in metrics.items():
        label = METRICS[name].label if name in METRICS else name
        seq = block["sequential"]
        if seq is None:
            out.append(MetricVerdict(label, block["verdict"], tolerance=tolerance))
            continue
        median = (
            "slower"
            if seq["median_slower"]
            else "faster"
            if seq["median_faster"]
            else "inconclusive"
        )
        p99 = seq.get("p99")
        ci = block["speedup"]["p99"]
        out.append(
            MetricVerdict(
                label,
                block["verdict"],
                median=median,
                p99=p99["verdict"]
                if p99 is not None
                else ("slower" if seq["p99_slower"] else "inconclusive"),
                median_bounds=(_nan(seq["median_ratio_lower"]), _nan(seq["median_ratio_upper"])),
                p99_log_e=_p99_log_e(p99),
                p99_boundary=p99["slower"]["boundary"] if p99 is not None else math.nan,
                p99_ci=(_nan(ci["lower"]), _nan(ci["upper"])),
                tolerance=tolerance,
            )
        )
    return tuple(out)


def _p99_log_e(p99: P99Verdict | None) -> tuple[float, float]:
    """The (slower, faster) log e-values of the design's P99 e-process (exceedance on split
    traffic, two-sample on mirrored pairs)."""
    if p99 is None:
        return (math.nan, math.nan)
    pair = (p99["slower"], p99["faster"])
    split = "exceedance" in p99.get("tests", [])
    if split and "exceedance_slower" in p99 and "exceedance_faster" in p99:
        pair = (p99["exceedance_slower"], p99["exceedance_faster"])
    return (_nan(pair[0]["statistic"]), _nan(pair[1]["statistic"]))


def _headline_fields(metrics: dict[str, Any], tolerance: float) -> dict[str, Any]:
    """The `DiagnosisInput` fields the headline reads: the quoted interval (TPOT median, else
    E2E median) and every verdict."""
    metric = "tpot"
    quoted = metrics["tpot"]["speedup"]["median"]
    if quoted["status"] != "ok":
        metric = "e2e"
        quoted = metrics["e2e"]["speedup"]["median"]
    return {
        "speedup": _nan(quoted["estimate"]),
        "speedup_lower": _nan(quoted["lower"]),
        "speedup_upper": _nan(quoted["upper"]),
        "metric": METRICS[metric].label if metric in METRICS else metric,
        "statistic": "median",
        "e2e_verdict": metrics["e2e"]["verdict"],
        "verdicts": _metric_verdicts(metrics, tolerance),
    }


def diagnose_metrics(
    metrics: dict[str, Any],
    engine: dict[Arm, EngineSummary],
    *,
    steps: tuple[float | None, float | None] = (None, None),
    tolerance: float = DEFAULT_P99_TOLERANCE,
) -> Diagnosis:
    """The diagnosis tree on a window's metric blocks (raw-row or rollup comparisons alike);
    `steps` = (baseline, speculative) median step times when the rows are at hand."""
    e2e = metrics["e2e"]
    needed = max(e2e["speedup"]["p99"]["n_needed"].values())
    spec_summary = e2e["summary"][Arm.SPECULATIVE.value]
    ttft_median = metrics["ttft"]["summary"][Arm.SPECULATIVE.value]["median"]
    share = (
        ttft_median / spec_summary["median"]
        if ttft_median is not None and spec_summary["median"]
        else None
    )
    return diagnose(
        DiagnosisInput(
            **_headline_fields(metrics, tolerance),
            enough_samples=needed == 0,
            samples_needed=needed,
            speculative=engine.get(Arm.SPECULATIVE, EngineSummary()),
            baseline=engine.get(Arm.BASELINE, EngineSummary()),
            ttft_share=share,
            baseline_step_s=steps[0],
            speculative_step_s=steps[1],
        )
    )


def refresh_headline(window: WindowComparison, *, tolerance: float) -> None:
    """Re-derive the headline of a window whose verdicts changed after it was diagnosed (the
    whole-run hysteresis, `stats.hysteresis`), so that it never contradicts them; the other
    reasons are kept as they were."""
    diagnosis = window["diagnosis"]
    kept = [
        Reason(r["code"], r["message"])
        for r in diagnosis["reasons"]
        if r["code"] not in HEADLINE_CODES
    ]
    d = DiagnosisInput(
        **_headline_fields(dict(window["metrics"]), tolerance),
        enough_samples=True,  # not read by the headline
        samples_needed=0,
        speculative=EngineSummary(),
        baseline=EngineSummary(),
    )
    diagnosis["summary"] = headline(d, kept)
    diagnosis["reasons"] = [{"code": r.code, "message": r.message} for r in kept]


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)
