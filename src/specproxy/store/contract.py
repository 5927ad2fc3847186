"""The store's contract, split by consumer: what each one may call, and the values reads return.

`Sink` is what the proxy and the scrapers write through, `SummaryReader` what the stats process
reads (and compacts), `History` the stats results, `Export` what the report, `specproxy export`
and the benchmarks read, `Control` the arm-control events every replica polls; `Lifecycle` opens
and closes. A caller annotates with the protocol it
uses. Every backend implements all of them: `buffered.BufferedStore` the sink half and the life
cycle once, each backend module (`memory`, `sqlite`, `postgres`) the readers; the tests in
tests/store/test_base.py run against every backend. Every method is safe to call from the event
loop; reads never return numpy (`summary.rows`, `summary.packed` and `summary.compaction` are the
numpy side of records, fine bins and compaction).
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from specproxy.control.events import ArmEvent
from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.summary.engine import StoredView
from specproxy.summary.tiering import CompactionBounds

__all__ = [
    "BlockKey",
    "BlockTarget",
    "Control",
    "EncodedBlock",
    "Export",
    "FineKey",
    "Fold",
    "History",
    "Lifecycle",
    "MomentRead",
    "Packed",
    "Row",
    "Sink",
    "StatsStore",
    "SummaryReader",
    "TierRead",
    "TierVersions",
]

Row = tuple[Any, ...]
BlockKey = tuple[int, int, str, str]  # start, span, model, arm (of one run and metric)
FineKey = tuple[int, str, str]  # minute, model, arm
BlockTarget = tuple[str, int, int, str, str]  # metric, start, span, model, arm
# One fine minute's bins or counts as the backend packs them: comma-separated text (SQLite),
# big-endian int4 bins / int8 counts (PostgreSQL) or a list (memory); `summary.packed` unpacks.
Packed = str | bytes | list[int]


@dataclass(frozen=True, slots=True)
class TierVersions:
    """What a reader holds already: the `n` of each block and of each fine minute."""

    blocks: Mapping[BlockKey, int] = field(default_factory=dict)
    fine: Mapping[FineKey, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TierRead:
    """One metric of one run from one snapshot: every block's and fine minute's key and `n`, and
    the contents of those whose `n` differs from the reader's `TierVersions` (a block's `n` only
    grows as rows are folded in, so it is the block's version)."""

    blocks: list[tuple[int, int, str, str, int]]  # start, span, model, arm, n: all of them
    blobs: dict[BlockKey, bytes]  # changed blocks only (`summary.blocks.Block` encodings)
    minutes: list[tuple[int, str, str, int, float, float]]  # minute, model, arm, n, total, sq
    # (bins, counts) per fine key of the minutes holding a changed key only, packed as the
    # backend packs them, not necessarily in bin order (`summary.packed` unpacks and sorts)
    bins: dict[FineKey, tuple[Packed, Packed]]

    def requests(self) -> dict[str, int]:
        """Requests per arm name in the whole snapshot (changed or not)."""
        out: dict[str, int] = {}
        for *_key, arm, n in self.blocks:
            out[arm] = out.get(arm, 0) + n
        for _minute, _model, arm, n, _total, _sq in self.minutes:
            out[arm] = out.get(arm, 0) + n
        return out

    @property
    def rows(self) -> int:
        """Rows (or blobs) the read transferred."""
        fine = sum(_packed_len(bins) for bins, _counts in self.bins.values())
        return len(self.blocks) + len(self.blobs) + len(self.minutes) + fine


def _packed_len(bins: Packed) -> int:
    if isinstance(bins, str):
        return bins.count(",") + 1 if bins else 0
    if isinstance(bins, bytes):
        return len(bins) // 4
    return len(bins)


@dataclass(frozen=True, slots=True)
class MomentRead:
    """One run's length-adjustment moments: (start, model, arm, *MOMENT_SUMS) per hour, every
    hour; (minute, model, arm, *MOMENT_SUMS) per minute from the minute asked for."""

    hours: list[Row]
    minutes: list[Row]


class EncodedBlock(Protocol):
    """A block a fold wrote (`summary.blocks.Block`): its request count and its encoding."""

    @property
    def n(self) -> int: ...

    def encode(self) -> bytes: ...


class Fold(Protocol):
    """`summary.compaction.fold`: the blocks to write from the rows a pass took."""

    def __call__(
        self,
        *,
        bounds: CompactionBounds,
        minute_blocks: Iterable[tuple[str, int, str, str, bytes]],
        summaries: Iterable[tuple[str, int, str, str, int, float, float]],
        bins: Iterable[tuple[str, int, str, str, int, int]],
        stored: Callable[[BlockTarget], bytes | None],
    ) -> Sequence[tuple[str, int, int, str, str, EncodedBlock]]: ...


class Sink(Protocol):
    """The proxy's and the scrapers' side: queue rows, never block, never raise."""

    @abc.abstractmethod
    def record(self, rec: RequestRecord) -> None:
        """Queue a request record."""

    @abc.abstractmethod
    def record_engine(self, sample: EngineSample) -> None:
        """Queue an engine sample."""

    @abc.abstractmethod
    def record_gpu(self, sample: GpuSample) -> None:
        """Queue a GPU sample."""

    @abc.abstractmethod
    def label_models(self, model_label: Callable[[str], str]) -> None:
        """Key the rollups of every later write by `model_label(record.model)` (a bounded
        label) instead of the client's string; the request rows keep the string."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Write everything queued so far; `StoreError` when the store is unavailable."""

    @property
    @abc.abstractmethod
    def pending(self) -> int:
        """Rows queued but not yet durable."""

    @property
    @abc.abstractmethod
    def dropped(self) -> int:
        """Rows lost for good; must stay 0."""


class Lifecycle(Protocol):
    @abc.abstractmethod
    async def start(self, *, read_only: bool = False) -> None:
        """Connect and migrate (`read_only`: only read, never write, migrate or replay)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush what is queued (or spill it), then release every resource."""


class SummaryReader(Protocol):
    """The stats process's reads: rollup tiers, moments, records, engine and GPU summaries."""

    @abc.abstractmethod
    async def read_tiers(self, *, run_id: str, metric: str, known: TierVersions) -> TierRead:
        """Every rollup block and fine minute of `metric` from one snapshot: keys and `n` of
        all, contents of those whose `n` is not what `known` holds."""

    @abc.abstractmethod
    async def read_moments(self, *, run_id: str, since_minute: int) -> MomentRead:
        """Every hour row of the run's moments and its minute rows from `since_minute` on."""

    @abc.abstractmethod
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
        """Request rows with since <= t_start < until per arm (both arms present), as tuples in
        `columns` order and t_start order, from one snapshot; shadow rows included. Values as
        recorded: numbers, str (arm and error kind as their values), bool, None. `usable_only`:
        status 200, no error kind, client connected, not rerouted (`RequestRecord.comparable`).
        `ended_since` <= t_start + e2e_s < `ended_until`: requests that ended in a span (a row
        is written when its request ends, so this reads what landed since an earlier read, by
        an index, however old the requests' starts). An unknown column is a `StoreError`."""

    @abc.abstractmethod
    async def read_engine(self, *, run_id: str, since: Sequence[float]) -> StoredView:
        """From one snapshot: per window start in `since` (-inf: the whole run) and arm the
        aggregate of the engine samples at or after it, and the samples that date restarts."""

    @abc.abstractmethod
    async def read_gpu_samples(
        self, *, run_id: str, since: float | None = None, limit: int | None = None
    ) -> dict[Arm, list[GpuSample]]:
        """GPU samples with t >= since, per arm the newest `limit` (all when None) in time
        order; only arms that have any."""

    @abc.abstractmethod
    async def compact(self, *, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        """One compaction pass of the run's rollups within `bounds`, taking rows, folding them
        with `fold` and writing the blocks in one transaction; the rows taken. Only the stats
        leader calls it."""

    @abc.abstractmethod
    async def fold_pending(self) -> int:
        """Roll up every request row written pending (`store.rollups = "deferred"`, by any
        replica and run) into the rollup tables, as an inline write would have, and mark it
        done, one transaction per batch; the rows folded. A row is folded once, whoever else
        folds at the same time. The stats leader calls it before each tick."""

    @abc.abstractmethod
    async def run_ids(self) -> list[str]:
        """Distinct run ids holding records."""


class History(Protocol):
    """The stats results, as JSON-able dicts."""

    @abc.abstractmethod
    async def write_stats(self, *, run_id: str, t: float, result: dict[str, Any]) -> None:
        """Append one result."""

    @abc.abstractmethod
    async def read_stats_history(
        self, *, run_id: str, since: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        """Results with t >= since, in time order."""

    @abc.abstractmethod
    async def latest_stats(
        self, *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None:
        """The newest result, or None when there is none newer than `newer_than` (an index
        lookup: a follower polls it)."""


class Export(Protocol):
    """What the report, `specproxy export` and the benchmarks read."""

    @abc.abstractmethod
    def export_chunks(
        self, *, run_id: str | None = None, chunk_rows: int = 10_000
    ) -> AsyncIterator[list[Row]]:
        """Stored records as tuples in `schema.REQUEST_COLUMNS` order, t_start order, chunked."""

    @abc.abstractmethod
    async def read_engine_samples(
        self, *, run_id: str, since: float | None = None, arm: Arm | None = None
    ) -> list[EngineSample]:
        """Engine samples in time order (restart markers included)."""

    @abc.abstractmethod
    async def models(self, *, run_id: str) -> list[str]:
        """Distinct models of a run's records."""

    @abc.abstractmethod
    async def run_ids(self) -> list[str]:
        """Distinct run ids holding records."""

    @abc.abstractmethod
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
        """`SummaryReader.read_records`."""


class Control(Protocol):
    """Arm-control events (`specproxy.control.events`): appended by the admin API and the guarded
    ramp, polled by every replica."""

    @abc.abstractmethod
    async def add_arm_event(self, event: ArmEvent) -> ArmEvent:
        """Append one event; returns it with the id the store gave it (ids grow)."""

    @abc.abstractmethod
    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]:
        """The run's events with id > `after_id`, in id order."""


class StatsStore(SummaryReader, History, Protocol):
    """What the stats job uses: the summary reads and the history."""
