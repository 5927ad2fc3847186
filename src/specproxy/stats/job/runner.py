"""The periodic comparison job and its JSON result (`specproxy stats`, in `cli`, computes once).

Every `stats.interval_s` the job reads the run's records and engine samples from the store once,
then, in a worker thread (numpy releases the GIL; nothing heavy runs on the event loop),
compares the arms for every window in `stats.windows_s` and for every model plus all models
together. The latest result is kept in memory (`StatsJob.latest`, served at `GET /api/stats`),
exposed as Prometheus gauges (`collector.StatsCollector`) and appended to the store's history.

`StatsJob` runs in the process that computes (`specproxy stats --follow`, `process`; inside the
proxy only for a `memory://` store). With several such processes on one store only the elected
leader (`leader.Leadership`) computes; the others ask again every interval, which is how one
takes over within an interval when the leader dies. The proxies serve the latest result the
leader stored (`follower.StatsFollower`: same JSON, same `computed_at`), so the gauges are
identical across replicas.

Warm-up exclusion is decided on the whole run, per arm and across models, by
`clean.warmup_exclusion` (the rule the report shares): the first `stats.warmup_requests` usable
requests of the run, and the first `scrape.warmup_requests` usable requests (plus those within
`scrape.warmup_seconds`) after every restart the scraper reported, dated by `clean.restart_times`.

The result is a `result.StatsResult` (schema version `result.SCHEMA_VERSION`): its TypedDicts
are the schema, and `result.STATISTICS` / `result.METRICS` the lists it iterates over, which it
also publishes in `settings` for readers that are not Python (ui/app.js).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
from prometheus_client import CollectorRegistry

from specproxy.config import ScrapeConfig, StatsConfig
from specproxy.records import Arm, EngineSample, GpuSample
from specproxy.stats.anytime.hysteresis import WHOLE_RUN, VerdictMemory
from specproxy.stats.clean import usable_mask, warmup_exclusion
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.compare import (
    REQUIRED_COLUMNS,
    CompareSettings,
    compare_window,
    refresh_headline,
)
from specproxy.stats.diagnosis import summarise_arms
from specproxy.stats.job.cache import RollupCache
from specproxy.stats.job.leader import Leadership
from specproxy.stats.job.rollups import compute_from_rollups, tick_reads
from specproxy.stats.result import (
    SCHEMA_VERSION,
    Settings,
    StatsResult,
    WindowResult,
    settings_lists,
)
from specproxy.store.base import ArmArrays, Store
from specproxy.summary.engine import EngineView, StoredView, as_view
from specproxy.summary.minute import ROLLUP_METRICS

__all__ = [
    "GPU_SAMPLES_READ",
    "SCHEMA_VERSION",
    "StatsJob",
    "compute_from_arrays",
    "compute_stats",
    "result_settings",
    "window_label",
]

log = logging.getLogger(__name__)

# GPU samples a tick reads per arm, the newest (~28 h at the default 5 s scrape): the GPU summary
# of a window longer than that (the whole run) covers its last 20,000 scrapes. Bounded because
# every tick decodes them: 30 days of them (518,400 per arm) took 12.8 CPU-s and 780 MB to read.
GPU_SAMPLES_READ = 20_000


def window_label(window_s: float | None) -> str:
    """ "all" for the whole run, else the largest whole unit: "5m", "1h", "1d", "90s"."""
    if window_s is None:
        return "all"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if window_s >= size and window_s % size == 0:
            return f"{int(window_s // size)}{unit}"
    return f"{window_s:g}s"


def _subset(arrays: ArmArrays, mask: np.ndarray[Any, np.dtype[np.bool_]]) -> ArmArrays:
    return {k: np.asarray(v)[mask] for k, v in arrays.items()}


def _relabel(arrays: ArmArrays, label: Callable[[str], str]) -> ArmArrays:
    """The arrays with each model replaced by its bounded label."""
    cache: dict[Any, str] = {}
    models = [
        cache[m] if m in cache else cache.setdefault(m, label(str(m)))
        for m in np.asarray(arrays["model"])
    ]
    return {**arrays, "model": np.array(models, dtype=object)}


def _only_model(arrays: Mapping[Arm, ArmArrays], model: str) -> bool:
    """Whether every row of every arm names `model` (after relabelling)."""
    return all(bool(np.all(np.asarray(a["model"]) == model)) for a in arrays.values())


def _rows_window_end(arrays: Mapping[Arm, ArmArrays], window_end: float | None) -> float:
    """The row path's window end: `window_end`, else the latest request start (else now)."""
    if window_end is not None:
        return window_end
    ends = [float(np.max(a["t_start"])) for a in arrays.values() if len(a["t_start"])]
    return max(ends) if ends else time.time()


def _row_window_start(window_s: float | None, window_end: float) -> float:
    return -math.inf if window_s is None else window_end - window_s


async def _engine_view(store: Store, run_id: str, starts: Sequence[float]) -> StoredView:
    """What a tick needs of the run's engine samples, computed by the store: the aggregates
    from each window start and the samples that date restarts (never every sample)."""
    aggregates = await store.read_engine_aggregates(run_id=run_id, since=sorted(set(starts)))
    return StoredView(aggregates, await store.read_restart_samples(run_id=run_id))


def compute_from_arrays(
    arrays: dict[Arm, ArmArrays],
    engine_samples: Sequence[EngineSample] | EngineView,
    *,
    run_id: str,
    stats_cfg: StatsConfig,
    scrape_cfg: ScrapeConfig | None = None,
    window_end: float | None = None,
    model_label: Callable[[str], str] | None = None,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None = None,
) -> StatsResult:
    """The whole result (`result.StatsResult`) from a run's arrays; CPU only.

    `model_label` bounds the per-model results (`fleet.models.ModelLabels.label`): models it
    maps to the same label are compared together under that label. `gpu_samples` holds the GPU
    telemetry of the arms that have it (`scrape.dcgmloop`), summarised per window.
    `engine_samples`: the run's engine samples, or a store's `engineagg.StoredView` of them
    holding the aggregates from each window's start.
    """
    started = time.perf_counter()
    scrape_cfg = scrape_cfg or ScrapeConfig()
    engine = as_view(engine_samples)
    kept: dict[Arm, ArmArrays] = {}
    excluded: dict[Arm, np.ndarray[Any, np.dtype[np.bool_]]] = {}
    for arm in Arm:
        cols = arrays.get(arm) or {c: np.array([]) for c in REQUIRED_COLUMNS}
        t_start = np.asarray(cols["t_start"], dtype=np.float64)
        order = np.argsort(t_start, kind="stable")
        cols = {k: np.asarray(v)[order] for k, v in cols.items()}
        mask = warmup_exclusion(
            cols, engine.restart_samples, arm, stats_cfg=stats_cfg, scrape_cfg=scrape_cfg
        )
        kept[arm] = _subset(cols, ~mask)
        excluded[arm] = mask
        arrays = {**arrays, arm: cols}
    window_end = _rows_window_end(arrays, window_end)
    if model_label is not None:
        arrays = {arm: _relabel(a, model_label) for arm, a in arrays.items()}
        kept = {arm: _relabel(a, model_label) for arm, a in kept.items()}
    # Only models that served at least one usable request: a 404 for a misspelt model name must
    # not become a dashboard option with no data.
    models = sorted(
        {str(m) for a in kept.values() for m in a["model"][usable_mask(a)] if m is not None}
    )
    settings = CompareSettings.from_config(stats_cfg)
    rng = np.random.default_rng(stats_cfg.seed)
    results: dict[str, dict[str, WindowResult]] = {}
    for model in ["all", *models]:
        if model != "all" and _only_model(arrays, model):
            # Every row of the run (usable or not, kept or warm-up) has this model, so its
            # selections are the "all" ones: the same windows again would only cost a second
            # bootstrap of identical data (half of a single-model tick) with other random draws.
            results[model] = copy.deepcopy(results["all"])
            continue
        per_window: dict[str, WindowResult] = {}
        for window_s in stats_cfg.windows_s:
            since = _row_window_start(window_s, window_end)
            selected: dict[Arm, ArmArrays] = {}
            n_excluded: dict[str, int] = {}
            for arm in Arm:
                a = kept[arm]
                mask = np.asarray(a["t_start"], dtype=np.float64) >= since
                if model != "all":
                    mask &= np.asarray(a["model"]) == model
                selected[arm] = _subset(a, mask)
                t_all = np.asarray(arrays[arm]["t_start"], dtype=np.float64)
                in_window = t_all >= since
                if model != "all":
                    in_window &= np.asarray(arrays[arm]["model"]) == model
                n_excluded[arm.value] = int(np.sum(excluded[arm] & in_window))
            summaries = summarise_arms(engine, gpu_samples, since=since)
            result = compare_window(selected, engine=summaries, settings=settings, rng=rng)
            per_window[window_label(window_s)] = {
                "window_s": window_s,
                **result,
                "excluded_warmup": n_excluded,
            }
        results[model] = per_window
    horizons = [float(np.max(a["t_start"])) for a in arrays.values() if len(a["t_start"])]
    horizon = max(horizons) if horizons else None
    computed_at = time.time()
    return {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id,
        "source": "rows",
        "computed_at": computed_at,
        "duration_s": time.perf_counter() - started,
        "window_end": window_end,
        "data_horizon": horizon,
        "lag_s": computed_at - horizon if horizon is not None else None,
        "settings": result_settings(stats_cfg, scrape_cfg),
        "results": results,
    }


def result_settings(stats_cfg: StatsConfig, scrape_cfg: ScrapeConfig) -> Settings:
    """The settings block of a result (both the row and the rollup path)."""
    statistics, metrics = settings_lists()
    return {
        "resamples": stats_cfg.resamples,
        "confidence": stats_cfg.confidence,
        "alpha": stats_cfg.alpha,
        "p99_tolerance": stats_cfg.p99_tolerance,
        "warmup_requests": stats_cfg.warmup_requests,
        "seed": stats_cfg.seed,
        "restart_warmup_requests": scrape_cfg.warmup_requests,
        "restart_warmup_seconds": scrape_cfg.warmup_seconds,
        "raw_rows_max": stats_cfg.raw_rows_max,
        "statistics": statistics,
        "metrics": metrics,
    }


async def compute_stats(
    store: Store,
    *,
    run_id: str,
    stats_cfg: StatsConfig,
    scrape_cfg: ScrapeConfig | None = None,
    window_end: float | None = None,
    model_label: Callable[[str], str] | None = None,
    gpu_samples: Mapping[Arm, Sequence[GpuSample]] | None = None,
    cache: RollupCache | None = None,
    executor: Executor | None = None,
) -> StatsResult:
    """Read the run from the store, then compute in a worker thread.

    Rows or rollups (`stats.raw_rows_max`, see `rollupjob`): the rollups' counts tell how many
    usable requests the run holds without touching its rows. `cache` (the job's, kept between
    ticks) makes the rollup read incremental; without one every tier is read. `executor` runs the
    computation (the job's own single thread, see `StatsJob`); None: the loop's default one.
    `gpu_samples` None: the run's stored ones, the newest `GPU_SAMPLES_READ` per arm
    (`Store.read_gpu_samples`; an arm without any, as one without exporters, has its GPU
    branches not evaluated).
    """
    loop = asyncio.get_running_loop()
    if gpu_samples is None:
        gpu_samples = await store.read_gpu_samples(run_id=run_id, limit=GPU_SAMPLES_READ)
    cache = cache if cache is not None else RollupCache()
    # e2e first: its counts decide rows or rollups, and only rollups need the other metrics
    await cache.refresh(
        store,
        run_id,
        ("e2e", *(m for m in ROLLUP_METRICS if m != "e2e")),
        go_on=lambda requests: max(requests.values(), default=0) > stats_cfg.raw_rows_max,
    )
    if max(tier.n for tier in cache.tiers["e2e"].values()) > stats_cfg.raw_rows_max:
        windows = [(w, window_label(w)) for w in stats_cfg.windows_s]
        reads = await loop.run_in_executor(
            executor, functools.partial(tick_reads, cache.tiers, stats_cfg.windows_s, window_end)
        )
        window_end = reads.window_end
        samples = await _engine_view(store, run_id, reads.engine_starts)
        moments = await store.read_moments(run_id=run_id, since_minute=reads.moments_from)
        started = time.perf_counter()
        scrape_cfg = scrape_cfg or ScrapeConfig()
        out = await loop.run_in_executor(
            executor,
            functools.partial(
                compute_from_rollups,
                cache.tiers,
                samples,
                windows=windows,
                stats_cfg=stats_cfg,
                scrape_cfg=scrape_cfg,
                window_end=window_end,
                gpu_samples=gpu_samples,
                model_label=model_label,
                moments=moments,
            ),
        )
        computed_at = time.time()
        horizon = out.data_horizon
        return {
            "schema_version": SCHEMA_VERSION,
            "run_id": run_id,
            "source": "rollups",
            "computed_at": computed_at,
            "duration_s": time.perf_counter() - started,
            "window_end": out.window_end,
            "data_horizon": horizon,
            "lag_s": computed_at - horizon if horizon is not None else None,
            "settings": result_settings(stats_cfg, scrape_cfg),
            "results": out.results,
        }
    arrays = await store.read_arrays(run_id=run_id, columns=REQUIRED_COLUMNS)
    end = _rows_window_end(arrays, window_end)
    starts = [_row_window_start(w, end) for w in stats_cfg.windows_s]
    samples = await _engine_view(store, run_id, starts)
    return await loop.run_in_executor(
        executor,
        functools.partial(
            compute_from_arrays,
            arrays,
            samples,
            run_id=run_id,
            stats_cfg=stats_cfg,
            scrape_cfg=scrape_cfg,
            window_end=end,
            model_label=model_label,
            gpu_samples=gpu_samples,
        ),
    )


class StatsJob:
    """Runs `compute_stats` every `stats_cfg.interval_s` while it leads, and keeps the latest
    result. `on_leadership` hears each change of leadership (the stats process reports it to
    the proxy that started it)."""

    def __init__(
        self,
        store: Store,
        *,
        run_id: str,
        stats_cfg: StatsConfig,
        scrape_cfg: ScrapeConfig | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        model_label: Callable[[str], str] | None = None,
        gpu_samples: Callable[[], Mapping[Arm, Sequence[GpuSample]]] | None = None,
        on_leadership: Callable[[bool], None] | None = None,
    ) -> None:
        self._store = store
        self._gpu_samples = gpu_samples  # per-arm GPU samples, read each run; None: the store's
        self._model_label = model_label
        self._run_id = run_id
        self._stats_cfg = stats_cfg
        self._scrape_cfg = scrape_cfg
        self._clock = clock
        self._leadership = leadership
        self._on_leadership = on_leadership
        self.leader: bool | None = None  # None until the first interval asked
        self._latest: StatsResult | None = None
        self._memory = VerdictMemory()  # whole-run verdict hysteresis (stats.hysteresis)
        self._cache = RollupCache()  # the run's rollup tiers, refreshed incrementally per tick
        # One thread computes every tick. Through the loop's default pool each tick could land on
        # another of its threads, and glibc gives each thread its own malloc arena that keeps its
        # high-water mark: the process grew by one tick's working set per pool thread (+175 MiB
        # over 30k hostile requests, tests/faults/test_hostile_input.py). One thread, one arena.
        self._executor: ThreadPoolExecutor | None = None  # made on first use, shut in `close`
        self._task: asyncio.Task[None] | None = None
        if registry is not None:
            register_stats_collector(registry, self.latest, self.is_leader)

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="specproxy-stats")
        return self._executor

    def is_leader(self) -> bool | None:
        """Whether this process computes (None before the first interval)."""
        return self.leader

    def latest(self) -> StatsResult | None:
        """The last result this job computed, None before the first run."""
        return self._latest

    async def run_once(self) -> StatsResult:
        """Compute now, publish, append to the store's history, then compact the run's closed
        rollups (the leader's chore). Compaction comes last so it never delays a result: once a
        minute it folds that minute's ~70k fine rows at 1k req/s (0.5-0.8 s), and the next
        tick's incremental read picks up the blocks it wrote."""
        result = await compute_stats(
            self._store,
            run_id=self._run_id,
            stats_cfg=self._stats_cfg,
            scrape_cfg=self._scrape_cfg,
            window_end=self._clock(),
            model_label=self._model_label,
            gpu_samples=self._gpu_samples() if self._gpu_samples is not None else None,
            cache=self._cache,
            executor=self._pool(),
        )
        tolerance = self._stats_cfg.p99_tolerance
        self._memory.apply(result, tolerance=tolerance)
        for windows in result["results"].values():  # whole-run verdicts may have changed
            if WHOLE_RUN in windows:
                refresh_headline(windows[WHOLE_RUN], tolerance=tolerance)
        self._latest = result
        try:
            await self._store.write_stats(
                run_id=self._run_id,
                t=result["computed_at"],
                result=cast(dict[str, Any], result),  # stored as JSON
            )
        except Exception:  # history is best effort; the live result is already published
            log.exception("stats: could not write the history row")
        try:
            await self._store.compact_rollups(run_id=self._run_id, now=self._clock())
        except Exception:  # retried next interval; the fine rows stay until then
            log.exception("stats: rollup compaction failed")
        return result

    async def step(self) -> StatsResult | None:
        """One interval: compute if this process leads (else wait for the next interval)."""
        leader = True if self._leadership is None else await self._leadership.is_leader()
        if leader != self.leader:
            log.info("stats: this process is %s", "the leader" if leader else "waiting to lead")
            self.leader = leader
            if self._on_leadership is not None:
                self._on_leadership(leader)
        return await self.run_once() if leader else None

    async def _loop(self) -> None:
        while True:
            try:
                await self.step()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("stats: computation failed; retrying next interval")
            await asyncio.sleep(self._stats_cfg.interval_s)

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="specproxy-stats")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        # A tick still computing finishes in its thread (numpy cannot be interrupted); nothing
        # waits for it here, and the interpreter joins the thread at exit.
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._leadership is not None:
            await self._leadership.close()
