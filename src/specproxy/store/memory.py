"""`memory://`: the store kept in process memory, for tests and as a fallback without a disk.

It goes through the same buffering and spill machinery as the real backends, so tests of the
proxy see the same timing (rows appear after a flush); `fail_writes` simulates an outage. Its
tables are keyed like the SQL ones (duplicates ignored alike), its aggregates are the same
declarations (`aggregates.AdditiveTable`), and it answers the same reads from them, except the
engine windows, which it sums from the samples themselves (exact, where SQL sums hour rows).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import AsyncIterator, Sequence
from typing import Any

from specproxy.config import StoreConfig
from specproxy.control.events import ArmEvent
from specproxy.errors import StoreError
from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.store.aggregates import (
    AGGREGATES,
    ROLLUP_BINS,
    ROLLUP_MINUTES,
    ROLLUP_MOMENT_HOURS,
    ROLLUP_MOMENTS,
    AdditiveTable,
    Aggregate,
    Inserted,
    RollupCut,
    RowsCut,
    aggregate_rows,
)
from specproxy.store.buffered import BufferedStore
from specproxy.store.contract import (
    BlockKey,
    FineKey,
    Fold,
    MomentRead,
    Packed,
    Row,
    TierRead,
    TierVersions,
)
from specproxy.store.queries import RecordQuery
from specproxy.store.registry import register_backend
from specproxy.store.rollups import changed_blocks, changed_minutes
from specproxy.store.schema import REQUEST_COLUMNS, gpu_by_arm
from specproxy.summary.engine import SampleView, StoredView, restart_evidence
from specproxy.summary.tiering import MINUTE_SPAN, CompactionBounds

__all__ = ["MemoryStore"]

RequestKey = tuple[str, str, str, bool]
StoredBlockKey = tuple[str, str, int, int, str, str]  # run_id, metric, start, span, model, arm


@register_backend("memory")
class MemoryStore(BufferedStore):
    """Rows in dicts keyed like the SQL tables, so duplicates are ignored the same way."""

    def __init__(self, cfg: StoreConfig, *, run_id: str = "default") -> None:
        super().__init__(cfg, run_id=run_id)
        self.fail_writes = False
        self._rows: dict[RequestKey, RequestRecord] = {}
        self._samples: dict[tuple[str, str, float], EngineSample] = {}
        self._gpu: dict[tuple[str, str, float], GpuSample] = {}
        self._stats: list[tuple[str, float, dict[str, Any]]] = []
        self._blocks: dict[StoredBlockKey, tuple[int, bytes]] = {}  # (n, blob)
        self._tables = {a.table: AdditiveTable(a) for a in AGGREGATES}
        self._arm_events: list[ArmEvent] = []
        self._pending: dict[RequestKey, RequestRecord] = {}  # rows written, rollups deferred

    def _table(self, aggregate: Aggregate) -> AdditiveTable:
        return self._tables[aggregate.table]

    # -- hooks ---------------------------------------------------------------------------------

    async def _open(self) -> None:
        self._check_up()

    async def _write(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        self._check_up()
        new: list[RequestRecord] = []
        for rec in requests:
            key = (rec.run_id, rec.request_id, rec.arm, rec.shadow)
            if key not in self._rows:
                self._rows[key] = rec
                new.append(rec)
        taken = [
            self._samples.setdefault((s.run_id, s.arm, s.t), s)
            for s in engine
            if (s.run_id, s.arm, s.t) not in self._samples
        ]
        if self.deferred:  # the stats leader rolls them up (`fold_pending`)
            self._pending.update(((r.run_id, r.request_id, r.arm, r.shadow), r) for r in new)
            new = []
        for aggregate, rows in aggregate_rows(Inserted(new, taken, self._model_label)):
            self._table(aggregate).add(rows)
        for g in gpu:
            self._gpu.setdefault((g.run_id, g.arm, g.t), g)

    async def _close_backend(self) -> None:
        return None

    async def _purge(self, before: float) -> int:
        # a row still pending stays until it is rolled up (`fold_pending`)
        old_rows = [
            k for k, r in self._rows.items() if r.t_start < before and k not in self._pending
        ]
        old_samples = [k for k, s in self._samples.items() if s.t < before]
        old_gpu = [k for k, g in self._gpu.items() if g.t < before]
        for k in old_rows:
            del self._rows[k]
        for key in old_samples:
            del self._samples[key]
        for key in old_gpu:
            del self._gpu[key]
        kept = [s for s in self._stats if s[1] >= before]
        removed = len(old_rows) + len(old_samples) + len(old_gpu) + len(self._stats) - len(kept)
        self._stats = kept
        for aggregate in AGGREGATES:  # the cut's unit rebuilt from the rows kept, as in SQL
            cut = aggregate.retention
            if isinstance(cut, RowsCut):
                unit = cut.unit_of(before)
                kept_rows = [r for r in self._rows.values() if cut.unit_of(r.t_start) == unit]
                kept_samples = [s for s in self._samples.values() if cut.unit_of(s.t) == unit]
                self._table(aggregate).cut_through(unit)
                inserted = Inserted(kept_rows, kept_samples, self._model_label)
                self._table(aggregate).add(aggregate.rows(inserted))
        return removed

    async def _purge_rollups(self, before_minute: int) -> int:
        old = [k for k in self._blocks if k[2] + k[3] <= before_minute]
        for k in old:
            del self._blocks[k]
        return len(old) + sum(
            self._table(a).cut(before_minute)
            for a in AGGREGATES
            if isinstance(a.retention, RollupCut)
        )

    async def _fold_pending(self) -> int:
        self._check_up()
        taken = list(self._pending.values())
        self._pending.clear()
        for aggregate, rows in aggregate_rows(Inserted(taken, (), self._model_label)):
            self._table(aggregate).add(rows)
        return len(taken)

    async def _compact(self, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        self._check_up()
        taken_blocks = [
            (k[1], k[2], k[4], k[5], self._blocks.pop(k)[1])
            for k in list(self._blocks)
            if k[0] == run_id and k[3] == MINUTE_SPAN and k[2] < bounds.blocks_before(k[1])
        ]

        def fine(key: Row) -> bool:
            return bool(key[0] == run_id and key[2] < bounds.fine_before)

        sums = [r[1:] for r in self._table(ROLLUP_MINUTES).take(fine)]
        bins = [r[1:] for r in self._table(ROLLUP_BINS).take(fine)]

        def stored(target: tuple[str, int, int, str, str]) -> bytes | None:
            block = self._blocks.get((run_id, *target))
            return block[1] if block is not None else None

        folded = fold(
            bounds=bounds, minute_blocks=taken_blocks, summaries=sums, bins=bins, stored=stored
        )
        for metric, start, span, model, arm, block in folded:
            self._blocks[(run_id, metric, start, span, model, arm)] = (block.n, block.encode())
        return len(taken_blocks) + len(sums) + len(bins)

    def _check_up(self) -> None:
        if self.fail_writes:
            raise ConnectionError("memory store: simulated outage")

    # -- SummaryReader ------------------------------------------------------------------------

    async def read_tiers(self, *, run_id: str, metric: str, known: TierVersions) -> TierRead:
        self._check_up()
        mine = {k[2:]: v for k, v in self._blocks.items() if k[0] == run_id and k[1] == metric}
        listing = [(*key, n) for key, (n, _blob) in mine.items()]
        blobs: dict[BlockKey, bytes] = {k: mine[k][1] for k in changed_blocks(listing, known)}

        def of_metric(key: Row) -> bool:
            return bool(key[0] == run_id and key[1] == metric)

        minutes = [r[2:] for r in self._table(ROLLUP_MINUTES).select(of_metric)]
        wanted = set(changed_minutes(minutes, known))
        grouped: dict[FineKey, list[tuple[int, int]]] = {}
        for _run, _metric, minute, model, arm, b, count in sorted(
            self._table(ROLLUP_BINS).select(lambda k: of_metric(k) and k[2] in wanted)
        ):
            grouped.setdefault((minute, model, arm), []).append((b, count))
        bins: dict[FineKey, tuple[Packed, Packed]] = {
            key: ([b for b, _c in pairs], [c for _b, c in pairs]) for key, pairs in grouped.items()
        }
        return TierRead(listing, blobs, minutes, bins)

    async def read_moments(self, *, run_id: str, since_minute: int) -> MomentRead:
        self._check_up()
        hours = self._table(ROLLUP_MOMENT_HOURS).select(lambda k: k[0] == run_id)
        minutes = self._table(ROLLUP_MOMENTS).select(
            lambda k: k[0] == run_id and k[1] >= since_minute
        )
        return MomentRead([r[1:] for r in hours], [r[1:] for r in minutes])

    async def read_records(
        self,
        *,
        run_id: str,
        columns: Sequence[str],
        since: float | None = None,
        until: float | None = None,
        usable_only: bool = False,
        ended_since: float | None = None,
        ended_until: float | None = None,
    ) -> dict[Arm, list[Row]]:
        self._check_up()
        query = RecordQuery.of(run_id, columns, since, until, usable_only, ended_since, ended_until)
        records = self.all_records()
        return {
            arm: [
                tuple(_plain(getattr(r, c)) for c in query.columns)
                for r in records
                if query.matches(r, arm)
            ]
            for arm in sorted({r.arm for r in records if r.run_id == run_id})
        }

    async def read_engine(self, *, run_id: str, since: Sequence[float]) -> StoredView:
        """From the samples themselves, summed in time order: exactly what a computation fed
        every sample gets (tests compare the two), where SQL sums hours and then the rest."""
        self._check_up()
        samples = await self.read_engine_samples(run_id=run_id)
        view = SampleView(samples)
        arms = sorted({s.arm for s in samples})
        aggregates = {start: {arm: view.aggregate(arm, start) for arm in arms} for start in since}
        restarts = sorted(
            (s for arm in arms for s in restart_evidence(samples, arm)), key=lambda s: s.t
        )
        return StoredView(aggregates, restarts)

    async def read_gpu_samples(
        self, *, run_id: str, since: float | None = None, limit: int | None = None
    ) -> dict[Arm, list[GpuSample]]:
        self._check_up()
        return gpu_by_arm(
            (
                g
                for g in self._gpu.values()
                if g.run_id == run_id and (since is None or g.t >= since)
            ),
            limit,
        )

    async def run_ids(self) -> list[str]:
        return sorted({r.run_id for r in self._rows.values()})

    # -- History --------------------------------------------------------------------------------

    async def write_stats(self, *, run_id: str, t: float, result: dict[str, Any]) -> None:
        if self.fail_writes:
            raise StoreError("memory store: simulated outage")
        self._stats.append((run_id, t, copy.deepcopy(result)))

    async def read_stats_history(
        self, *, run_id: str, since: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        rows = [
            (t, copy.deepcopy(r))
            for rid, t, r in self._stats
            if rid == run_id and (since is None or t >= since)
        ]
        return sorted(rows, key=lambda row: row[0])

    async def latest_stats(
        self, *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None:
        rows = await self.read_stats_history(run_id=run_id)
        if not rows or (newer_than is not None and rows[-1][0] <= newer_than):
            return None
        return rows[-1]

    # -- Control --------------------------------------------------------------------------------

    async def add_arm_event(self, event: ArmEvent) -> ArmEvent:
        if self.fail_writes:
            raise StoreError("memory store: simulated outage")
        stored = dataclasses.replace(event, id=len(self._arm_events) + 1)
        self._arm_events.append(stored)
        return stored

    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]:
        if self.fail_writes:
            raise StoreError("memory store: simulated outage")
        return [e for e in self._arm_events if e.run_id == run_id and e.id > after_id]

    # -- Export ---------------------------------------------------------------------------------

    def all_records(self) -> list[RequestRecord]:
        """Every stored record, in t_start order."""
        return sorted(self._rows.values(), key=lambda r: r.t_start)

    async def read_engine_samples(
        self, *, run_id: str, since: float | None = None, arm: Arm | None = None
    ) -> list[EngineSample]:
        return sorted(
            (
                s
                for s in self._samples.values()
                if s.run_id == run_id
                and (since is None or s.t >= since)
                and (arm is None or s.arm is arm)
            ),
            key=lambda s: s.t,
        )

    async def models(self, *, run_id: str) -> list[str]:
        return sorted({r.model for r in self._rows.values() if r.run_id == run_id})

    async def export_chunks(
        self, *, run_id: str | None = None, chunk_rows: int = 10_000
    ) -> AsyncIterator[list[Row]]:
        rows = [
            tuple(_plain(getattr(r, c)) for c in REQUEST_COLUMNS)
            for r in self.all_records()
            if run_id is None or r.run_id == run_id
        ]
        for i in range(0, len(rows), chunk_rows):
            yield rows[i : i + chunk_rows]


def _plain(value: Any) -> Any:
    """A record's value as a SQL store returns it: enums (arm, error kind) as their values."""
    return value.value if isinstance(value, enum.Enum) else value
