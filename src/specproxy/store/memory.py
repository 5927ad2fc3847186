"""`memory://`: the store kept in process memory, for tests and as a fallback without a disk.

It goes through the same buffering and spill machinery as the real backends, so tests of the
proxy see the same timing (rows appear after a flush); `fail_writes` simulates an outage.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Sequence
from typing import Any

from specproxy.config import StoreConfig
from specproxy.errors import StoreError
from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.store.aggregates import (
    AGGREGATES,
    ROLLUP_BINS,
    ROLLUP_MINUTES,
    ROLLUP_MOMENT_HOURS,
    ROLLUP_MOMENTS,
    AdditiveTable,
    Inserted,
    RollupCut,
    RowsCut,
    aggregate_rows,
)
from specproxy.store.arrays import ArmArrays, rows_to_arrays
from specproxy.store.base import RecordQuery
from specproxy.store.buffered import BufferedStore
from specproxy.store.moments import MomentRead
from specproxy.store.registry import register_backend
from specproxy.store.rollups import (
    RollupRows,
    TierRead,
    TierVersions,
    changed_blocks,
    changed_minutes,
    group_fine_bins,
    rollup_rows_from,
)
from specproxy.store.schema import REQUEST_COLUMNS, gpu_by_arm
from specproxy.summary.blocks import Block
from specproxy.summary.compaction import CompactionBounds, fold
from specproxy.summary.engine import EngineAggregate, SampleView, restart_evidence

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
        self._blocks: dict[StoredBlockKey, bytes] = {}
        self._tables = {a.table: AdditiveTable(a) for a in AGGREGATES}

    async def _open(self) -> None:
        self._check_up()

    async def _write(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        self._check_up()
        new: list[RequestRecord] = []
        for rec in requests:
            key = (rec.run_id, rec.request_id, rec.arm.value, rec.shadow)
            if key not in self._rows:
                self._rows[key] = rec
                new.append(rec)
        taken = [
            self._samples.setdefault((s.run_id, s.arm.value, s.t), s)
            for s in engine
            if (s.run_id, s.arm.value, s.t) not in self._samples
        ]
        for aggregate, rows in aggregate_rows(Inserted(new, taken, self._model_label)):
            self._tables[aggregate.table].add(rows)
        for g in gpu:
            self._gpu.setdefault((g.run_id, g.arm.value, g.t), g)

    async def _close_backend(self) -> None:
        return None

    async def _purge(self, before: float) -> int:
        old_rows = [k for k, r in self._rows.items() if r.t_start < before]
        old_samples = [k for k, s in self._samples.items() if s.t < before]
        for k in old_rows:
            del self._rows[k]
        for key in old_samples:
            del self._samples[key]
        old_gpu = [k for k, g in self._gpu.items() if g.t < before]
        for key in old_gpu:
            del self._gpu[key]
        kept = [s for s in self._stats if s[1] >= before]
        removed = len(old_rows) + len(old_samples) + len(old_gpu) + len(self._stats) - len(kept)
        self._stats = kept
        for aggregate in AGGREGATES:  # rebuilt from the rows kept, as the SQL backends do
            cut = aggregate.retention
            if isinstance(cut, RowsCut):
                unit = cut.unit_of(before)
                table = self._tables[aggregate.table]
                table.cut_through(unit)
                table.add(
                    aggregate.rows(
                        Inserted(
                            [r for r in self._rows.values() if cut.unit_of(r.t_start) == unit],
                            [s for s in self._samples.values() if cut.unit_of(s.t) == unit],
                            self._model_label,
                        )
                    )
                )
        return removed

    async def _purge_rollups(self, before_minute: int) -> int:
        removed = 0
        for bk in [bk for bk in self._blocks if bk[2] + bk[3] <= before_minute]:
            del self._blocks[bk]
            removed += 1
        for aggregate in AGGREGATES:
            if isinstance(aggregate.retention, RollupCut):
                removed += self._tables[aggregate.table].cut(before_minute)
        return removed

    async def read_moments(self, *, run_id: str, since_minute: int) -> MomentRead:
        self._check_up()
        hours = self._tables[ROLLUP_MOMENT_HOURS.table].select(lambda k: k[0] == run_id)
        minutes = self._tables[ROLLUP_MOMENTS.table].select(
            lambda k: k[0] == run_id and k[1] >= since_minute
        )
        return MomentRead([r[1:] for r in hours], [r[1:] for r in minutes])

    async def _compact(self, run_id: str, bounds: CompactionBounds) -> int:
        self._check_up()
        taken_blocks = [
            (k[1], k[2], k[4], k[5], self._blocks.pop(k))
            for k in list(self._blocks)
            if k[0] == run_id and k[3] == 1 and k[2] < bounds.hours_before
        ]

        def fine(key: tuple[Any, ...]) -> bool:
            return bool(key[0] == run_id and key[2] < bounds.fine_before)

        sums = [r[1:] for r in self._tables[ROLLUP_MINUTES.table].take(fine)]
        bins = [r[1:] for r in self._tables[ROLLUP_BINS.table].take(fine)]
        folded = fold(
            bounds=bounds,
            minute_blocks=taken_blocks,
            summaries=sums,
            bins=bins,
            stored=lambda t: self._blocks.get((run_id, *t)),
        )
        for metric, start, span, model, arm, block in folded:
            self._blocks[(run_id, metric, start, span, model, arm)] = block.encode()
        return len(taken_blocks) + len(sums) + len(bins)

    def _fine(self, run_id: str, metric: str) -> tuple[list[Any], list[Any]]:
        """(minute, model, arm, n, total, total_sq) and (minute, model, arm, bin, count) rows."""

        def mine(key: tuple[Any, ...]) -> bool:
            return bool(key[0] == run_id and key[1] == metric)

        minutes = [r[2:] for r in self._tables[ROLLUP_MINUTES.table].select(mine)]
        bins = [r[2:] for r in self._tables[ROLLUP_BINS.table].select(mine)]
        return minutes, bins

    async def read_rollup_tiers(self, *, run_id: str, metric: str, known: TierVersions) -> TierRead:
        mine = {k[2:]: v for k, v in self._blocks.items() if k[0] == run_id and k[1] == metric}
        listing = [(*k, Block.decode(k[0], v).n) for k, v in mine.items()]
        blobs = {k: mine[k] for k in changed_blocks(listing, known)}
        minutes, fine_bins = self._fine(run_id, metric)
        wanted = set(changed_minutes(minutes, known))
        bins: dict[tuple[int, str, str], tuple[Any, Any]] = {}
        for minute in wanted:
            group_fine_bins([r for r in fine_bins if r[0] == minute], bins)
        return TierRead(listing, blobs, minutes, bins)

    async def read_rollups(
        self,
        *,
        run_id: str,
        metric: str,
        since_minute: int,
        until_minute: int,
        model: str | None = None,
        with_bins: bool = True,
    ) -> dict[Arm, RollupRows]:
        """Rollups of `metric` for minutes in [since_minute, until_minute), per arm."""
        all_minutes, all_bins = self._fine(run_id, metric)
        out: dict[Arm, RollupRows] = {}
        for arm in Arm:

            def sel(row: tuple[Any, ...], arm: Arm = arm) -> bool:
                return bool(
                    since_minute <= row[0] < until_minute
                    and row[2] == arm.value
                    and (model is None or row[1] == model)
                )

            minutes = [(r[0], r[3], r[4], r[5]) for r in all_minutes if sel(r)]
            bins = [(r[0], r[3], r[4]) for r in all_bins if with_bins and sel(r)]
            out[arm] = rollup_rows_from(minutes, bins)
        return out

    def _check_up(self) -> None:
        if self.fail_writes:
            raise ConnectionError("memory store: simulated outage")

    def all_records(self) -> list[RequestRecord]:
        """Every stored record (tests)."""
        return sorted(self._rows.values(), key=lambda r: r.t_start)

    async def _read_arrays(self, query: RecordQuery) -> dict[Arm, ArmArrays]:
        records = self.all_records()
        return {
            arm: rows_to_arrays(
                query.columns,
                [
                    tuple(getattr(r, c) for c in query.columns)
                    for r in records
                    if query.matches(r, arm)
                ],
            )
            for arm in Arm
        }

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

    async def read_engine_aggregates(
        self, *, run_id: str, since: Sequence[float]
    ) -> dict[float, dict[Arm, EngineAggregate]]:
        samples = await self.read_engine_samples(run_id=run_id)
        view = SampleView(samples)
        return {start: {arm: view.aggregate(arm, start) for arm in Arm} for start in since}

    async def read_restart_samples(self, *, run_id: str) -> list[EngineSample]:
        samples = await self.read_engine_samples(run_id=run_id)
        kept = [s for arm in Arm for s in restart_evidence(samples, arm)]
        return sorted(kept, key=lambda s: s.t)

    async def read_gpu_samples(
        self, *, run_id: str, since: float | None = None, limit: int | None = None
    ) -> dict[Arm, list[GpuSample]]:
        return gpu_by_arm(
            (
                g
                for g in self._gpu.values()
                if g.run_id == run_id and (since is None or g.t >= since)
            ),
            limit,
        )

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

    async def models(self, *, run_id: str) -> list[str]:
        return sorted({r.model for r in self._rows.values() if r.run_id == run_id})

    async def run_ids(self) -> list[str]:
        return sorted({r.run_id for r in self._rows.values()})

    async def export_chunks(
        self, *, run_id: str | None = None, chunk_rows: int = 10_000
    ) -> AsyncIterator[list[tuple[Any, ...]]]:
        """Records as tuples in `REQUEST_COLUMNS` order (export), in chunks."""
        rows = [
            tuple(_plain(getattr(r, c)) for c in REQUEST_COLUMNS)
            for r in self.all_records()
            if run_id is None or r.run_id == run_id
        ]
        for i in range(0, len(rows), chunk_rows):
            yield rows[i : i + chunk_rows]


def _plain(value: Any) -> Any:
    return value.value if isinstance(value, Arm) else value
