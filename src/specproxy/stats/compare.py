"""One window's comparison of a treatment arm with the control arm: every estimate, test and
reason, from the two arms' `ArmWindow`s (pure; the schema is `stats.result`).

Design: with at least as many complete mirrored pairs as primary requests on the smaller arm
(a mirror fraction >= 50 %) the window is "paired": speedup intervals, summaries, outliers and
the anytime-valid tests use the pairs; otherwise "split", over the primary requests. Rank tests,
the sample-size estimate and the length adjustment always use the primary requests, whose arm
was drawn at random. Speedup = statistic(control) / statistic(treatment): > 1 is faster.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import numpy as np
import numpy.typing as npt

from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm
from specproxy.stats.anytime.decision import Decision, Evidence, fresh
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.diagnosis import (
    Diagnosis,
    DiagnosisInput,
    EngineSummary,
    LatencyGrowth,
    MetricVerdict,
    diagnose,
)
from specproxy.stats.estimate.adjust import adjusted_over_blocks
from specproxy.stats.estimate.blockboot import BlockBootstrapResult, block_speedup_intervals
from specproxy.stats.estimate.bootstrap import DEFAULT_RESAMPLES, paired_speedup_intervals
from specproxy.stats.estimate.outliers import count_outliers
from specproxy.stats.estimate.quantile import STATISTICS, samples_needed
from specproxy.stats.estimate.rank import rank_tests
from specproxy.stats.estimate.samplesize import samples_for_median_change
from specproxy.stats.queueing import latency_growth
from specproxy.stats.result import (
    METRICS,
    Interval,
    Metric,
    MetricResult,
    P99Verdict,
    Speedup,
    WindowComparison,
)
from specproxy.stats.sample import ArmSample, ArmWindow, Pairs

if TYPE_CHECKING:
    from specproxy.config import StatsConfig

__all__ = ["CompareSettings", "Recall", "compare_window", "diagnose_metrics", "metric_seed"]

FloatArray = npt.NDArray[np.float64]
DEFAULT_P99_TOLERANCE: Final = 0.05
# An interval narrower than this many times the grid's bound on a ratio says so (`speedup_block`).
GRID_NOTE_FACTOR: Final = 5
# The (control, treatment) arm names a comparison keys its per-arm fields by, unless given.
SHORTHAND_NAMES: Final = (SHORTHAND_CONTROL, SHORTHAND_TREATMENT)

# A metric's evidence -> its decision under the window's memory (`DecisionMemory.recall`)
Recall = Callable[[str, Evidence], Decision]


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


def metric_seed(seed: Sequence[int], metric: str) -> np.random.Generator:
    """The generator of one metric of one window, from the window's key: identical data (the
    same key) draws the same replicates whatever was computed before it."""
    return np.random.default_rng([*seed, list(METRICS).index(cast(Metric, metric))])


def compare_window(
    control: ArmWindow,
    treatment: ArmWindow,
    *,
    engine: Mapping[Arm, EngineSummary],
    settings: CompareSettings,
    seed: Sequence[int],
    pairs: Pairs | None = None,
    recall: Recall | None = None,
    names: tuple[Arm, Arm] = SHORTHAND_NAMES,
) -> WindowComparison:
    """Everything for one window: `seed` is the window's key (non-negative ints, `metric_seed`),
    `recall` the window's memory of the anytime-valid evidence (None: this tick alone), `names`
    the (control, treatment) arm names the per-arm fields are keyed by. `settings.alpha` is the
    level of this comparison's anytime-valid tests (the family's alpha / m with m treatments)."""
    c_name, t_name = names
    n_primary = min(control.requests, treatment.requests)
    paired = pairs is not None and pairs.count > 0 and pairs.count >= n_primary
    design: Literal["split", "paired"] = "paired" if paired else "split"
    metrics: dict[str, MetricResult] = {}
    for metric in METRICS:
        primary = (control.sample(metric), treatment.sample(metric))
        exact: tuple[FloatArray, FloatArray] | None = None
        chosen = primary
        if paired and pairs is not None and metric in pairs.control:
            chosen = pairs.samples(metric)
            exact = (pairs.control[metric], pairs.treatment[metric])
        moments = (
            (control.moments, treatment.moments)
            if metric == "e2e" and control.moments is not None and treatment.moments is not None
            else None
        )
        metrics[metric] = _metric(
            metric,
            primary,
            chosen,
            exact,
            moments,
            settings,
            metric_seed(seed, metric),
            recall,
            names,
        )
    steps = (_median(control.sample("step")), _median(treatment.sample("step")))
    diagnosis = diagnose_metrics(
        metrics,
        engine,
        steps=steps,
        tolerance=settings.p99_tolerance,
        queueing=latency_growth({c_name: control, t_name: treatment}),
        names=names,
    )
    return {
        "design": design,
        "pairs": pairs.count if pairs is not None else 0,
        "samples": {c_name: control.requests, t_name: treatment.requests},
        "metrics": metrics,
        "engine": {arm: engine[arm].to_dict() for arm in names if arm in engine},
        "diagnosis": diagnosis.to_dict(),
        "unavailable": [] if control.moments is not None else ["adjusted"],
    }


def _metric(
    metric: str,
    primary: tuple[ArmSample, ArmSample],
    design: tuple[ArmSample, ArmSample],
    exact: tuple[FloatArray, FloatArray] | None,
    moments: tuple[FloatArray, FloatArray] | None,
    settings: CompareSettings,
    rng: np.random.Generator,
    recall: Recall | None,
    names: tuple[Arm, Arm],
) -> MetricResult:
    c, t = design
    c_name, t_name = names
    iid = None
    if exact is not None:
        iid = paired_speedup_intervals(
            *exact,
            statistics=STATISTICS,
            rng=rng,
            resamples=settings.resamples,
            confidence=settings.confidence,
        )
    boot = block_speedup_intervals(
        c,
        t,
        statistics=STATISTICS,
        rng=rng,
        resamples=settings.resamples,
        confidence=settings.confidence,
        iid=iid,
    )
    both = c.n > 0 and t.n > 0
    adjusted = None
    if moments is not None and both:
        adj = adjusted_over_blocks(
            *moments,
            boot.plan,
            resamples=settings.resamples,
            confidence=settings.confidence,
            rng=rng,
        )
        adjusted = adj.to_dict() if adj is not None else None
    block: MetricResult = {
        "n": {c_name: c.n, t_name: t.n},
        "speedup": speedup_block(
            boot, c.n, t.n, settings.confidence, max(c.grid_error, t.grid_error), names
        ),
        "time_blocks": boot.plan.to_dict() if both else None,
        "summary": {
            arm: {stat: _finite(sample.statistic(stat)) for stat in STATISTICS}
            for arm, sample in ((c_name, c), (t_name, t))
        },
        "outliers": {c_name: count_outliers(c).to_dict(), t_name: count_outliers(t).to_dict()},
        "rank_tests": rank_tests(*primary, settings.confidence).to_dict(),
        "samples_for_5pct_median": samples_for_median_change(*primary, alpha=settings.alpha),
        "adjusted": adjusted,
        "sequential": None,
        "verdict": "inconclusive",
    }
    if both:
        now = evidence(c, t, alpha=settings.alpha, tolerance=settings.p99_tolerance, pairs=exact)
        decision = recall(metric, now) if recall is not None else fresh(now)
        block["sequential"] = decision.to_result()
        block["verdict"] = decision.verdict
    return block


def speedup_block(
    boot: BlockBootstrapResult,
    n_c: int,
    n_t: int,
    confidence: float,
    grid_error: float = 0.0,
    names: tuple[Arm, Arm] = SHORTHAND_NAMES,
) -> dict[str, Speedup]:
    """Per statistic: the reported interval (block, or i.i.d. with too few blocks), both
    intervals, and "insufficient" while an arm has too few samples for it. An interval whose
    half-width is within `GRID_NOTE_FACTOR` x `grid_error` (the histograms' bound on a ratio)
    says so: its bounds are then uncertain by a visible share of its width."""
    block: dict[str, Speedup] = {}
    for stat, found in boot.intervals.items():
        needed = {
            names[0]: samples_needed(stat, n_c, confidence),
            names[1]: samples_needed(stat, n_t, confidence),
        }
        shown = _hull(found.interval.to_dict())
        ok = not any(needed.values())
        note = found.reason
        lo, hi = shown["lower"], shown["upper"]
        if (
            ok
            and lo
            and hi
            and grid_error
            and math.log(hi / lo) / 2 < GRID_NOTE_FACTOR * grid_error
        ):
            precision = (
                f"the interval's half-width is within {GRID_NOTE_FACTOR}x of the {grid_error:.2%} "
                "the histograms it was read from may move a bound"
            )
            note = f"{note}; {precision}" if note else precision
        block[stat] = {
            "status": "ok" if ok else "insufficient",
            "n_needed": needed,
            "estimate": shown["estimate"] if ok else None,
            "lower": shown["lower"] if ok else None,
            "upper": shown["upper"] if ok else None,
            "method": found.reported,
            "iid": found.iid.to_dict(),
            "block": found.block.to_dict(),
            "differs": found.differs,
            "interval_note": note,
        }
    return block


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def _median(sample: ArmSample) -> float | None:
    """Median per-request mean gap between streamed content events (one engine step each)."""
    return _finite(sample.quantile(0.5)) if sample.n else None


def _nan(x: float | None) -> float:
    return math.nan if x is None else float(x)


def _metric_verdicts(metrics: Mapping[str, Any], tolerance: float) -> tuple[MetricVerdict, ...]:
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
    """The (slower, faster) log e-values of the design's P99 e-process."""
    if p99 is None:
        return (math.nan, math.nan)
    pair = (p99["slower"], p99["faster"])
    if "exceedance" in p99.get("tests", []) and "exceedance_slower" in p99:
        pair = (p99["exceedance_slower"], p99.get("exceedance_faster", p99["faster"]))
    return (_nan(pair[0]["statistic"]), _nan(pair[1]["statistic"]))


def diagnose_metrics(
    metrics: Mapping[str, Any],
    engine: Mapping[Arm, EngineSummary],
    *,
    steps: tuple[float | None, float | None] = (None, None),
    tolerance: float = DEFAULT_P99_TOLERANCE,
    queueing: tuple[LatencyGrowth, ...] = (),
    names: tuple[Arm, Arm] = SHORTHAND_NAMES,
) -> Diagnosis:
    """The diagnosis tree on a window's metric blocks; `steps` = (control, treatment) median
    step times (streamed requests' mean gap between content events), None when not streamed.
    The headline quotes TPOT's median interval, else E2E's, and reads every verdict."""
    metric: Metric = "tpot" if metrics["tpot"]["speedup"]["median"]["status"] == "ok" else "e2e"
    quoted = metrics[metric]["speedup"]["median"]
    e2e = metrics["e2e"]
    needed = max(e2e["speedup"]["p99"]["n_needed"].values())
    c_name, t_name = names
    t_median = e2e["summary"][t_name]["median"]
    ttft_median = metrics["ttft"]["summary"][t_name]["median"]
    share = ttft_median / t_median if ttft_median is not None and t_median else None
    return diagnose(
        DiagnosisInput(
            speedup=_nan(quoted["estimate"]),
            speedup_lower=_nan(quoted["lower"]),
            speedup_upper=_nan(quoted["upper"]),
            metric=METRICS[metric].label,
            statistic="median",
            e2e_verdict=e2e["verdict"],
            verdicts=_metric_verdicts(metrics, tolerance),
            enough_samples=needed == 0,
            samples_needed=needed,
            speculative=engine.get(t_name, EngineSummary()),
            baseline=engine.get(c_name, EngineSummary()),
            ttft_share=share,
            baseline_step_s=steps[0],
            speculative_step_s=steps[1],
            queueing=queueing,
            names=names,
        )
    )


def _hull(shown: Interval) -> Interval:
    """The shown interval holds its own estimate: a percentile interval of few, discrete
    replicates (medians of small samples over few blocks) can lie beside the point estimate, and
    an interval that excludes the number printed in it reads as a bug. Widening to the estimate
    only raises coverage."""
    est, lo, hi = shown["estimate"], shown["lower"], shown["upper"]
    if est is None or lo is None or hi is None:
        return shown
    return {"estimate": est, "lower": min(lo, est), "upper": max(hi, est)}
