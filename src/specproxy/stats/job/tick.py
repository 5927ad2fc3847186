"""One stats tick: every window of every segment, from a run's summaries (or its rows, when small).

`plan_tick` decides, from the summaries' counts, where each window's samples come from and which
units it spans; `compute_tick` turns each window into `ArmWindow`s (`frame`) and compares them
(`stats.compare.compare_window`) with the window's memory of the anytime-valid evidence; both are
pure. `compute_stats` reads the store, then computes on the job's thread. A window's bootstrap
seed is its key (base seed, segment, units), so identical data draws identical replicates.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

import numpy as np

from specproxy.config import StatsConfig, WarmupConfig
from specproxy.errors import ConfigError
from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm, GpuSample
from specproxy.stats.anytime.decision import Decision, DecisionMemory, Evidence
from specproxy.stats.best import BEST_METRIC, best_configuration
from specproxy.stats.compare import CompareSettings, Recall, compare_window
from specproxy.stats.diagnosis import EngineSummary, summarise_arms
from specproxy.stats.gate import window_gate
from specproxy.stats.job.cache import RollupCache
from specproxy.stats.job.frame import Frame, Tiers, WindowPlan, arm_window, segments_by_label
from specproxy.stats.job.rows import ROW_COLUMNS, ROWS_MAX, Rows, known_label, row_unit
from specproxy.stats.result import (
    SCHEMA_VERSION,
    Comparison,
    Conditions,
    Multiplicity,
    Settings,
    StatsResult,
    WindowResult,
    settings_lists,
)
from specproxy.stats.sample import ArmWindow
from specproxy.stats.segments import ArmRows, conditional
from specproxy.stats.warmup import WarmupRule, excluded_units, restart_times
from specproxy.store.contract import StatsStore
from specproxy.summary.engine import EngineView, as_view
from specproxy.summary.minute import ROLLUP_METRICS
from specproxy.summary.rows import records_to_arrays

__all__ = [
    "GPU_SAMPLES_READ",
    "ROWS_MAX",
    "TickPlan",
    "compute_stats",
    "compute_tick",
    "configs_of",
    "plan_tick",
    "result_settings",
    "run_treatments",
    "stored_evidence",
    "tiers_of",
    "warmup_rule",
    "window_conditions",
    "window_label",
]

# GPU samples a tick reads per arm, the newest (~28 h at the default 5 s scrape): the GPU summary
# of a longer window covers its last 20,000 scrapes (30 days of them took 12.8 CPU-s to read).
GPU_SAMPLES_READ = 20_000
ALL = "all"

log = logging.getLogger(__name__)


def window_label(window_s: float | None) -> str:
    """ "all" for the whole run, else the largest whole unit: "5m", "1h", "1d", "90s"."""
    if window_s is None:
        return ALL
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if window_s >= size and window_s % size == 0:
            return f"{int(window_s // size)}{unit}"
    return f"{window_s:g}s"


def run_treatments(
    control: Arm, found: Iterable[Arm], configured: Sequence[Arm] | None
) -> tuple[Arm, ...]:
    """The treatments a tick compares with `control`: the configured ones (in their order), else
    every other arm the data holds (in name order), else the shorthand's one.

    Without configured treatments, data holding two or more arms and none of them `control` is a
    run whose arms were named (`[arms.NAME]`, `bench --arm`, `ingest --arm`) by a process that
    did not say which is the control: comparing them with an arm that has no data would print
    empty comparisons, so it is refused, naming the arms."""
    if configured:
        return tuple(configured)
    others = sorted(set(found) - {control})
    if control not in found and len(others) >= 2:
        raise ConfigError(
            f"the run's arms are {', '.join(others)} and none is the control {control!r}: name"
            " the control (--control NAME, or --config with the run's [arms.NAME] tables)"
        )
    return tuple(others) if others else (SHORTHAND_TREATMENT,)


def warmup_rule(cfg: WarmupConfig) -> WarmupRule:
    return WarmupRule(cfg.requests, cfg.restart_requests, cfg.restart_seconds)


@dataclass(frozen=True, slots=True)
class _Window:
    window_s: float | None
    label: str
    tiers: Tiers
    plan: WindowPlan
    source: str  # "rows" | "summaries"


@dataclass(frozen=True, slots=True)
class TickPlan:
    """Where each window's samples come from and which units it spans."""

    frame: Frame
    windows: tuple[_Window, ...]
    rows: Rows | None
    future: int = 0  # usable requests stamped after the limit: in no window
    future_newest: float | None = None  # the newest such stamp (summaries: its minute's end)

    @property
    def horizon(self) -> float | None:
        """The newest data: the last request's start (rows), else the end of the last unit holding
        data; never after the window end."""
        span = self.rows.span() if self.rows is not None else None
        newest = span[1] if span is not None else self.frame.horizon
        return min(newest, self.frame.window_end) if newest is not None else None

    @property
    def engine_starts(self) -> list[float]:
        """Each window's first second (`Store.read_engine_aggregates`)."""
        return sorted({w.plan.start for w in self.windows})


def tiers_of(cache: RollupCache, unit_s: float = 60.0) -> Tiers:
    """The store's summaries as the cache holds them (minute units)."""
    return Tiers(unit_s, {m: dict(per_arm) for m, per_arm in cache.tiers.items()})


def plan_tick(
    tiers: Tiers,
    windows_s: Sequence[float | None],
    *,
    window_end: float | None,
    rows: Rows | None,
    label: Callable[[str], str],
    now: float | None = None,
    limit: float | None = None,
) -> TickPlan:
    """Each window from `rows` (finer units, pairs) when given, else from the summaries.

    `limit` (now plus `StatsConfig.future_skew_s`; None: no bound): data stamped after it is
    in no window and sets no horizon; the plan counts it (`TickPlan.future`). Rows are cut at
    the limit itself, the summaries at the minute holding it."""
    clock = time.time() if now is None else now
    frame = Frame.of(tiers, window_end, clock, limit)
    future, future_newest = frame.future, frame.future_end
    if rows is not None and limit is not None:
        rows, future, future_newest = rows.until(limit)
    span = rows.span() if rows is not None else None
    planned: list[_Window] = []
    by_unit: dict[float, Tiers] = {}
    for window_s in windows_s:
        if rows is None or span is None:
            planned.append(
                _Window(
                    window_s,
                    window_label(window_s),
                    tiers,
                    frame.plan(tiers, window_s),
                    "summaries",
                )
            )
            continue
        first = span[0] if window_s is None else max(span[0], frame.window_end - window_s)
        unit = row_unit(max(frame.window_end - first, 0.0))
        unit_tiers = by_unit.get(unit)
        if unit_tiers is None:
            unit_tiers = by_unit[unit] = rows.tiers(unit, label)
        row_frame = Frame.of(unit_tiers, frame.window_end, clock)
        plan = row_frame.plan(unit_tiers, window_s)
        planned.append(_Window(window_s, window_label(window_s), unit_tiers, plan, "rows"))
    return TickPlan(frame, tuple(planned), rows, future, future_newest)


def compute_tick(
    plan: TickPlan,
    engine: EngineView,
    *,
    run_id: str,
    stats_cfg: StatsConfig,
    warmup: WarmupConfig,
    label: Callable[[str], str] | None = None,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None = None,
    memory: DecisionMemory | None = None,
    now: float | None = None,
    control: Arm = SHORTHAND_CONTROL,
    treatments: Sequence[Arm] | None = None,
    labels: Mapping[Arm, Mapping[str, str]] | None = None,
) -> StatsResult:
    """The whole result from a planned tick; CPU only. `memory`: the computing job's memory of
    the anytime-valid evidence per (segment, window, metric), None for a one-off computation.
    `control`: the run's control arm; `treatments`: the arms compared with it (None: every
    other arm the data holds); `labels`: the arms' configured labels, which the result carries
    for the views (`arm_labels`)."""
    started = time.perf_counter()
    at = time.time() if now is None else now
    settings = CompareSettings.from_config(stats_cfg)
    rule = warmup_rule(warmup)
    found = {  # the arms holding data (rows give every arm asked for, empty ones too)
        arm for w in plan.windows for arm in w.tiers.arms if w.tiers.unit_counts(arm)[0].size
    }
    chosen = run_treatments(control, found, treatments)
    arms = (control, *chosen)
    restarts = {arm: restart_times(engine.restart_samples, arm) for arm in arms}
    excluded: dict[int, dict[Arm, set[int]]] = {}
    for w in plan.windows:
        key = id(w.tiers)
        if key not in excluded:
            excluded[key] = {
                arm: excluded_units(
                    *w.tiers.unit_counts(arm), restarts[arm], unit_s=w.tiers.unit_s, rule=rule
                )
                for arm in arms
            }
    summaries = [
        (w, summarise_arms(engine, gpu_samples, since=w.plan.start, arms=arms))
        for w in plan.windows
    ]
    primary = chosen[0]

    m = len(chosen)
    # Bonferroni: each comparison's anytime-valid tests at alpha / m (docs/statistics.md)
    each = dataclasses.replace(settings, alpha=stats_cfg.alpha / m)
    multiplicity: Multiplicity = {
        "method": "bonferroni",
        "treatments": m,
        "alpha": stats_cfg.alpha,
        "alpha_per_comparison": each.alpha,
    }

    def compare(
        w: _Window,
        engine_summary: Mapping[Arm, EngineSummary],
        segment: str,
        keys: frozenset[str] | None,
        windows: Mapping[Arm, ArmWindow],
        treatment: Arm,
    ) -> Comparison:
        gone = excluded[id(w.tiers)]
        names = (control, treatment)
        pairs = (
            plan.rows.pairs(w.plan, gone, names)
            if plan.rows is not None and w.source == "rows" and keys is None
            else None
        )
        # the first treatment keeps the two-arm keys (memory, seeds); others add their name
        tag = "" if treatment == primary else f"@{treatment}"
        recall = (
            _recall(memory, (segment, w.label), w.window_s, at, tag) if memory is not None else None
        )
        seed = _seed(stats_cfg.seed, segment, w.plan)
        if tag:
            seed.append(zlib.crc32(treatment.encode()))
        comparison = compare_window(
            windows[control],
            windows[treatment],
            engine=engine_summary,
            settings=each,
            seed=seed,
            pairs=pairs,
            recall=recall,
            names=names,
        )
        # speedups by condition and the crossover: the whole-run window of all models, from rows
        conditions = (
            window_conditions(plan.rows, w.plan, gone, settings, seed, control, treatment)
            if plan.rows is not None and w.source == "rows" and w.window_s is None and keys is None
            else None
        )
        said = conditions["summary"] if conditions is not None else None
        if said:  # the diagnosis says where speculation stops paying off, in words
            comparison["diagnosis"]["reasons"].append(
                {"code": "crossover", "message": said, "detail": None}
            )
        return {
            **comparison,
            "treatment": treatment,
            "excluded_warmup": {arm: windows[arm].excluded_warmup for arm in names},
            "gate": window_gate(comparison, stats_cfg.p99_tolerance),
            "conditions": conditions,
        }

    def windows_of(segment: str, keys: frozenset[str] | None) -> dict[str, WindowResult]:
        out: dict[str, WindowResult] = {}
        for w, engine_summary in summaries:
            gone = excluded[id(w.tiers)]
            windows = {arm: arm_window(w.tiers, w.plan, arm, gone[arm], keys) for arm in arms}
            each_one = {t: compare(w, engine_summary, segment, keys, windows, t) for t in chosen}
            first = each_one[primary]
            result: WindowResult = {
                **{k: v for k, v in first.items() if k != "treatment"},  # type: ignore[typeddict-item]
                "window_s": w.window_s,
                "excluded_warmup": first["excluded_warmup"],
                "source": "rows" if w.source == "rows" else "summaries",
                "unit_s": w.plan.unit_s,
                "span": list(w.plan.span),
                "grid_error_bound": w.plan.grid_error,
                "control": control,
                "treatments": list(chosen),
                "multiplicity": multiplicity,
                "best": best_configuration(
                    each_one,
                    {t: windows[t].sample(BEST_METRIC) for t in chosen},
                    alpha_each=each.alpha,
                    confidence=settings.confidence,
                    resamples=settings.resamples,
                    rng=np.random.default_rng([*_seed(stats_cfg.seed, segment, w.plan), 7]),
                ),
                "comparisons": each_one,
            }
            out[w.label] = result
        return out

    results: dict[str, dict[str, WindowResult]] = {ALL: windows_of(ALL, None)}
    base = plan.windows[0].tiers if plan.windows else None
    groups = segments_by_label(base, label) if base is not None else {}
    for segment, keys in groups.items():
        # one label holding every summary of the run: its selections are the "all" ones
        results[segment] = (
            copy.deepcopy(results[ALL]) if len(groups) == 1 else windows_of(segment, keys)
        )
    horizon = plan.horizon
    computed_at = time.time()
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "computed_at": computed_at,
        "duration_s": time.perf_counter() - started,
        "window_end": plan.frame.window_end,
        "data_horizon": horizon,
        # never below 0: a row within the skew allowance may start after computed_at
        "lag_s": max(computed_at - horizon, 0.0) if horizon is not None else None,
        "future_rows": plan.future,
        "future_newest": plan.future_newest,
        "settings": result_settings(stats_cfg, warmup),
        "results": results,
        "arm_labels": {arm: dict(kv) for arm, kv in (labels or {}).items() if kv},
    }


def stored_evidence(
    result: Mapping[str, Any], stats_cfg: StatsConfig, treatments: int | None = None
) -> dict[tuple[str, str, str], tuple[float, Evidence]]:
    """What each (segment, window, metric) held in a stored result, for `DecisionMemory.seed`: a
    new leader (or a restarted stats process) goes on from its predecessor's evidence instead of
    from nothing. Empty when the result was computed at another alpha or tolerance: evidence is
    kept only at the level and against the null it was gathered for. `treatments` (m, when
    known): a window computed with another m is skipped, its tests ran at another alpha / m."""
    settings = result.get("settings") or {}
    same = (
        settings.get("alpha") == stats_cfg.alpha
        and settings.get("p99_tolerance") == stats_cfg.p99_tolerance
    )
    at = result.get("computed_at")
    if not same or not isinstance(at, int | float):
        return {}
    out: dict[tuple[str, str, str], tuple[float, Evidence]] = {}
    for segment, windows in (result.get("results") or {}).items():
        for label, window in windows.items():
            held_m = (window.get("multiplicity") or {}).get("treatments", 1)
            if treatments is not None and held_m != treatments:
                continue
            first = (window.get("treatments") or [None])[0]
            blocks = [("", window)] + [
                (f"@{arm}", c)
                for arm, c in (window.get("comparisons") or {}).items()
                if arm != first
            ]  # a treatment after the first keeps its evidence under "METRIC@NAME"
            for tag, comparison in blocks:
                for metric, block in (comparison.get("metrics") or {}).items():
                    seq = block.get("sequential")
                    evidence = (
                        Evidence.of_result(seq, stats_cfg.p99_tolerance)
                        if seq is not None
                        else None
                    )
                    if evidence is not None:
                        out[(segment, label, metric + tag)] = (float(at), evidence)
    return out


def _recall(
    memory: DecisionMemory, key: tuple[str, str], span_s: float | None, at: float, tag: str = ""
) -> Recall:
    """A window's memory as `compare_window` asks it, one metric at a time; `tag` ("@NAME")
    keeps a treatment other than the first apart (its metrics are keyed "e2e@NAME")."""

    def recall(metric: str, now: Evidence) -> Decision:
        return memory.recall((*key, metric + tag), now, at=at, span_s=span_s)

    return recall


def window_conditions(
    rows: Rows,
    plan: WindowPlan,
    excluded: Mapping[Arm, set[int]],
    settings: CompareSettings,
    seed: list[int],
    control: Arm,
    treatment: Arm,
) -> Conditions:
    """The window's speedups by condition (`stats.segments`), control against one treatment,
    from its rows less the warm-up units."""

    def arm_rows(arm: Arm) -> ArmRows:
        return ArmRows.of(
            rows.arrays[arm],
            lo=plan.lo,
            hi=plan.hi,
            unit_s=plan.unit_s,
            excluded=excluded.get(arm, set()),
        )

    return conditional(
        arm_rows(control),
        arm_rows(treatment),
        units=plan.units,
        unit_s=plan.unit_s,
        rng=np.random.default_rng([*seed, 26]),
        resamples=settings.resamples,
        confidence=settings.confidence,
    )


def _seed(base: int, segment: str, plan: WindowPlan) -> list[int]:
    """A window's key as a seed: the same data (segment and units) draws the same replicates."""
    return [
        base & 0xFFFFFFFF,
        zlib.crc32(segment.encode()),
        plan.lo & 0xFFFFFFFFFFFF,
        plan.hi & 0xFFFFFFFFFFFF,
        round(plan.unit_s * 1000),
    ]


def result_settings(stats_cfg: StatsConfig, warmup: WarmupConfig) -> Settings:
    """The settings a result was computed with: `specproxy stats` reuses them by default."""
    statistics, metrics = settings_lists()
    return {
        "resamples": stats_cfg.resamples,
        "confidence": stats_cfg.confidence,
        "alpha": stats_cfg.alpha,
        "p99_tolerance": stats_cfg.p99_tolerance,
        "warmup_requests": warmup.requests,
        "seed": stats_cfg.seed,
        "restart_warmup_requests": warmup.restart_requests,
        "restart_warmup_seconds": warmup.restart_seconds,
        "windows_s": list(stats_cfg.windows_s),
        "statistics": statistics,
        "metrics": metrics,
    }


def configs_of(
    result: Mapping[str, Any], stats: StatsConfig, warmup: WarmupConfig
) -> tuple[StatsConfig, WarmupConfig]:
    """The configuration a stored result was computed with (its `settings`), over `stats` and
    `warmup` for what an older result lacks: offline analysis reproduces a live result.

    A result without `windows_s` in its settings (older versions) gives the windows it holds,
    shortest first and the whole run last (PostgreSQL's JSONB keeps no key order). A stored
    value is validated as the config's own: a tampered result raises `ConfigError`."""
    settings = result.get("settings") or {}
    stats_keys = {"resamples", "confidence", "alpha", "p99_tolerance", "seed"}
    chosen: dict[str, Any] = {k: settings[k] for k in stats_keys if k in settings}
    if "windows_s" in settings:
        chosen["windows_s"] = tuple(settings["windows_s"])
    else:
        windows = (result.get("results") or {}).get("all")
        if isinstance(windows, Mapping) and windows:
            lengths = {w.get("window_s") for w in windows.values() if isinstance(w, Mapping)}
            chosen["windows_s"] = tuple(sorted(lengths, key=lambda w: (w is None, w or 0.0)))
    moved = {
        "warmup_requests": "requests",
        "restart_warmup_requests": "restart_requests",
        "restart_warmup_seconds": "restart_seconds",
    }
    kept = {new: settings[old] for old, new in moved.items() if old in settings}
    try:
        return dataclasses.replace(stats, **chosen), dataclasses.replace(warmup, **kept)
    except TypeError as exc:  # a value of the wrong type, compared in a section's check
        raise ConfigError(f"the stored result's settings are malformed: {exc}") from exc


async def compute_stats(
    store: StatsStore,
    *,
    run_id: str,
    stats_cfg: StatsConfig,
    warmup: WarmupConfig | None = None,
    window_end: float | None = None,
    model_label: Callable[[str], str] | None = None,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None = None,
    cache: RollupCache | None = None,
    executor: Executor | None = None,
    memory: DecisionMemory | None = None,
    control: Arm = SHORTHAND_CONTROL,
    treatments: Sequence[Arm] | None = None,
    now: float | None = None,
    labels: Mapping[Arm, Mapping[str, str]] | None = None,
) -> StatsResult:
    """Read the run from the store, then compute on `executor` (None: the loop's default pool).
    `control`, `treatments` and `labels`: as `compute_tick` takes them.

    Windows end at `now` (None: the wall clock) plus `stats_cfg.future_skew_s` at the latest,
    whatever `window_end` says: rows stamped later (a clock stepped back, a replica's clock
    running fast on a shared store) are in no window, set no horizon, and are counted in the
    result's `future_rows` (with a warning in the log).

    `cache` (the job's, kept between ticks) makes the summaries' read incremental. A run with at
    most `ROWS_MAX` usable requests on its larger arm is read as rows. `gpu_samples` None: the
    newest `GPU_SAMPLES_READ` stored per arm."""
    loop = asyncio.get_running_loop()
    warmup = warmup or WarmupConfig()
    if gpu_samples is None:
        gpu_samples = await store.read_gpu_samples(run_id=run_id, limit=GPU_SAMPLES_READ)
    cache = cache if cache is not None else RollupCache()
    metrics = ("e2e", *(m for m in ROLLUP_METRICS if m != "e2e"))

    def large(requests: Mapping[str, int]) -> bool:
        return max(requests.values(), default=0) > ROWS_MAX

    await cache.refresh(store, run_id, metrics, go_on=large)
    tiers = tiers_of(cache)
    rows = None
    if not large({arm: tier.n for arm, tier in cache.tiers["e2e"].items()}):
        records = await store.read_records(run_id=run_id, columns=ROW_COLUMNS, usable_only=True)
        arms = (control, *(treatments or ()))
        rows = Rows(await asyncio.to_thread(records_to_arrays, ROW_COLUMNS, records, arms))
    label = model_label or known_label(tiers.keys())
    clock = time.time() if now is None else now
    plan = await loop.run_in_executor(
        executor,
        functools.partial(
            plan_tick,
            tiers,
            stats_cfg.windows_s,
            window_end=window_end,
            rows=rows,
            label=label,
            now=clock,
            limit=clock + stats_cfg.future_skew_s,
        ),
    )
    if plan.future:
        ahead = (plan.future_newest or clock) - clock
        log.warning(
            "stats: %d usable requests of run %s are stamped more than %g s after now (the "
            "newest %.0f s ahead): a clock stepped back, or a replica's clock runs fast on the "
            "shared store; they are left out of every window",
            plan.future,
            run_id,
            stats_cfg.future_skew_s,
            ahead,
        )
    by_unit = [w.plan.lo for w in plan.windows if w.source == "summaries" and not w.plan.hourly]
    if any(w.source == "summaries" for w in plan.windows):
        # windows reaching hour blocks take hour rows, the others minute rows from their start
        since = min(by_unit) if by_unit else plan.frame.last_unit + 1
        moments = await store.read_moments(run_id=run_id, since_minute=since)
        tiers.moment_hours, tiers.moment_units = moments.hours, moments.minutes
    engine = await store.read_engine(run_id=run_id, since=plan.engine_starts)
    return await loop.run_in_executor(
        executor,
        functools.partial(
            compute_tick,
            plan,
            as_view(engine),
            run_id=run_id,
            stats_cfg=stats_cfg,
            warmup=warmup,
            label=label,
            gpu_samples=gpu_samples,
            memory=memory,
            control=control,
            treatments=treatments,
            labels=labels,
        ),
    )
