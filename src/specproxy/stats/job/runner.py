"""The periodic statistics job (`compute_stats` each interval) and its latest result.

It runs in the process that computes (`specproxy stats --follow`, `process`; inside the proxy
only for a `memory://` store). Every `stats.interval_s` the elected leader (`leader.Leadership`)
computes a tick (`tick`), keeps each window's anytime-valid evidence across ticks
(`DecisionMemory`), appends the result to the store's history and compacts the run's closed
summaries; the others ask again every interval, which is how one takes over within an interval
when the leader dies. Proxies serve the latest stored result (`follower.StatsFollower`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, cast

from prometheus_client import CollectorRegistry

from specproxy.config import RampConfig, StatsConfig, WarmupConfig
from specproxy.records import SHORTHAND_CONTROL, Arm, GpuSample
from specproxy.stats.anytime.decision import DecisionMemory
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.job.cache import RollupCache
from specproxy.stats.job.leader import Leadership
from specproxy.stats.job.ramp import DEFAULT_HORIZON_S, RampJob, RampStore
from specproxy.stats.job.tick import compute_stats, stored_evidence
from specproxy.stats.result import StatsResult
from specproxy.store.contract import StatsStore
from specproxy.summary.compaction import fold
from specproxy.summary.tiering import CompactionBounds

__all__ = ["StatsJob", "compute_stats"]

log = logging.getLogger(__name__)


class StatsJob:
    """Runs `compute_stats` every `stats_cfg.interval_s` while it leads, and keeps the latest
    result. `on_leadership` hears each change of leadership (the stats process reports it to
    the proxy that started it)."""

    def __init__(
        self,
        store: StatsStore,
        *,
        run_id: str,
        stats_cfg: StatsConfig,
        warmup: WarmupConfig | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        leadership: Leadership | None = None,
        model_label: Callable[[str], str] | None = None,
        gpu_samples: Callable[[], Mapping[Arm, Sequence[GpuSample]]] | None = None,
        on_leadership: Callable[[bool], None] | None = None,
        control: Arm = SHORTHAND_CONTROL,
        treatments: Sequence[Arm] | None = None,
        ramp: RampConfig | None = None,
        ramp_weights: Mapping[str, float] | None = None,
        ramp_horizon_s: float | None = None,
        labels: Mapping[Arm, Mapping[str, str]] | None = None,
    ) -> None:
        """`control`, `treatments`: the run's arms (`Config.control_arm`, `treatment_arms`;
        None: every arm in the data but the control). `ramp` (when enabled) with `ramp_weights`,
        each ramped arm's configured weight, and `ramp_horizon_s`, how long a request may take
        (`settings.ramp_of`): the guarded ramp runs after every interval this process leads,
        just before its tick (`RampJob.move`). `labels`: the arms' configured labels, carried by
        every result for the views."""
        self._control = control
        self._labels = dict(labels or {})
        self._treatments = tuple(treatments) if treatments is not None else None
        self._store = store
        self._gpu_samples = gpu_samples  # per-arm GPU samples, read each run; None: the store's
        self._model_label = model_label
        self._run_id = run_id
        self._stats_cfg = stats_cfg
        self._warmup = warmup
        self._clock = clock
        self._leadership = leadership
        self._on_leadership = on_leadership
        self.leader: bool | None = None  # None until the first interval asked
        self._latest: StatsResult | None = None
        self._memory = DecisionMemory()  # each window's anytime-valid evidence across ticks
        self._cache = RollupCache()  # the run's rollup tiers, refreshed incrementally per tick
        # One thread computes every tick. Through the loop's default pool each tick could land on
        # another of its threads, and glibc gives each thread its own malloc arena that keeps its
        # high-water mark: the process grew by one tick's working set per pool thread (+175 MiB
        # over 30k hostile requests, tests/faults/test_hostile_input.py). One thread, one arena.
        self._executor: ThreadPoolExecutor | None = None  # made on first use, shut in `close`
        self._task: asyncio.Task[None] | None = None
        if registry is not None:
            register_stats_collector(registry, self.latest, self.is_leader)
        self._ramp_cfg = ramp if ramp is not None and ramp.enabled and ramp_weights else None
        self._ramp_weights = dict(ramp_weights or {})
        self._ramp_horizon_s = DEFAULT_HORIZON_S if ramp_horizon_s is None else ramp_horizon_s
        # Before any arm event the ramp reads the run's records since this job began.
        self._ramp_start = clock()
        self._ramp: RampJob | None = None  # made on first use: it shares the tick's one thread

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
        rollups (the leader's chore). With `[ramp]` the result carries the ramp's state
        (`RampJob.status`), as `step` left it just before. Compaction comes last so it never
        delays a result: once a minute it folds that minute's ~70k fine rows at 1k req/s
        (0.5-0.8 s), and the next tick's incremental read picks up the blocks it wrote.

        First it rolls up the request rows proxies wrote with deferred rollups
        (`store.rollups = "deferred"`, `fold_pending`), so the tick reads them."""
        try:
            await self._store.fold_pending()
        except Exception:  # retried next interval; the rows stay pending until then
            log.exception("stats: folding the pending rows into the rollups failed")
        now = self._clock()
        result = await compute_stats(
            self._store,
            run_id=self._run_id,
            stats_cfg=self._stats_cfg,
            warmup=self._warmup,
            window_end=now,
            now=now,
            model_label=self._model_label,
            gpu_samples=self._gpu_samples() if self._gpu_samples is not None else None,
            cache=self._cache,
            executor=self._pool(),
            memory=self._memory,
            control=self._control,
            treatments=self._treatments,
            labels=self._labels,
        )
        if self._ramp is not None:  # its moves so far, exported by every replica's collector
            result["ramp"] = self._ramp.status()
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
            bounds = CompactionBounds.at(self._clock())
            await self._store.compact(run_id=self._run_id, bounds=bounds, fold=fold)
        except Exception:  # retried next interval; the fine rows stay until then
            log.exception("stats: rollup compaction failed")
        return result

    async def step(self) -> StatsResult | None:
        """One interval: compute if this process leads (else wait for the next interval)."""
        leader = True if self._leadership is None else await self._leadership.is_leader()
        if leader != self.leader:
            log.info("stats: this process is %s", "the leader" if leader else "waiting to lead")
            if leader:
                await self._recall_stored()
            self.leader = leader
            if self._on_leadership is not None:
                self._on_leadership(leader)
        if not leader:
            return None
        await self._ramp_move()  # first, so the result this tick stores carries its state
        return await self.run_once()

    def ramp(self) -> RampJob | None:
        """The guarded ramp this job runs each interval, before the tick (None: `[ramp]` is off)."""
        if self._ramp_cfg is None:
            return None
        if self._ramp is None:
            self._ramp = RampJob(
                cast(RampStore, self._store),  # every store is also a `store.contract.Control`
                run_id=self._run_id,
                policy=self._ramp_cfg,
                stats_cfg=self._stats_cfg,
                configured=self._ramp_weights,
                run_start=self._ramp_start,
                control=self._control,
                clock=self._clock,
                executor=self._pool(),  # numpy off the event loop, on the tick's thread
                horizon_s=self._ramp_horizon_s,
            )
        return self._ramp

    async def _ramp_move(self) -> None:
        """The leader's ramp move each interval, before the tick (the ramp reads the records
        itself, not the tick's result); its failure is logged, never the tick's."""
        ramp = self.ramp()
        if ramp is None:
            return
        try:
            await ramp.move()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("ramp: the guarded ramp failed; the ticks go on, retrying next one")

    async def _recall_stored(self) -> None:
        """On taking the lead, start each window's memory from the run's last stored result
        (another leader's, or this process's before a restart); a fresh memory otherwise."""
        self._memory = DecisionMemory()
        try:
            newest = await self._store.latest_stats(run_id=self._run_id)
        except Exception:  # the memory then starts empty: valid, only slower to decide
            log.exception("stats: could not read the last stored result; starting afresh")
            return
        if newest is not None:
            m = len(self._treatments) if self._treatments is not None else None
            self._memory.seed(stored_evidence(newest[1], self._stats_cfg, m))

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
