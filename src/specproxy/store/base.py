"""The store contract, declared once: the proxy and the scraper write, the stats job reads.

`Store` below is the whole contract; `buffered.BufferedStore` implements its write half once for
every backend (a non-blocking `record`, batching, a background flusher, spilling to disk during
outages), and each backend implements the rest. Reads return numpy arrays per arm, because the
statistics work on columns, never on Python objects.

How to extend it (the tests in tests/store/test_base.py run against every backend):
- a new read or write: one abstract method on `Store` with its docstring, implemented in each
  backend (`memory`, `sqlite`, `postgres`); SQL that both SQL backends share goes in `queries`;
- a new table or column: a migration in `schema.MIGRATIONS` (both dialects, the same version),
  and the column lists in `schema` (`REQUEST_COLUMNS`, `ENGINE_COLUMNS`, `GPU_COLUMNS`) and
  `arrays`;
- a new backend: a module with a `BufferedStore` subclass decorated `@register_backend("scheme")`
  (`registry`), that module named for its scheme in `registry.BACKEND_MODULES` (which is also what
  `StoreConfig` accepts), and its URL among the `backend_url` params in tests/store/conftest.py.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.store.arrays import ArmArrays, check_columns
from specproxy.store.moments import MomentRead
from specproxy.store.rollups import RollupRows, TierRead, TierVersions
from specproxy.summary.engine import EngineAggregate

__all__ = ["ArmArrays", "RecordQuery", "Store"]


@dataclass(frozen=True, slots=True)
class RecordQuery:
    """The arguments of `Store.read_arrays`, checked: what a backend's `_read_arrays` serves."""

    run_id: str
    columns: tuple[str, ...]  # known record fields (`arrays.check_columns`)
    since: float | None = None  # since <= t_start
    until: float | None = None  # t_start < until
    model: str | None = None
    include_shadow: bool = True

    def matches(self, rec: RequestRecord, arm: Arm) -> bool:
        """Whether `rec` is one of the records of `arm` this query selects."""
        return (
            rec.run_id == self.run_id
            and rec.arm is arm
            and (self.since is None or rec.t_start >= self.since)
            and (self.until is None or rec.t_start < self.until)
            and (self.model is None or rec.model == self.model)
            and (self.include_shadow or not rec.shadow)
        )


class Store(abc.ABC):
    """What every backend provides. All methods are safe to call from the event loop."""

    # -- life cycle and writes (implemented once, by `BufferedStore`) ----------------------------

    @abc.abstractmethod
    async def start(self) -> None:
        """Open connections, run migrations, start the background flusher, replay any spill."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Flush everything still buffered (SIGTERM path), then release resources."""

    @abc.abstractmethod
    def record(self, rec: RequestRecord) -> None:
        """Queue a request record; never blocks, never raises."""

    @abc.abstractmethod
    def label_models(self, model_label: Callable[[str], str]) -> None:
        """Key the rollups of every later write by `model_label(record.model)` (the bounded
        label, `fleet.models.ModelLabels.label`) instead of the client's string; the request
        rows keep the string. Safe to call from the event loop at any time; a write thread sees
        the new labeller from its next batch."""

    @abc.abstractmethod
    def record_engine(self, sample: EngineSample) -> None:
        """Queue an engine sample; never blocks, never raises."""

    @abc.abstractmethod
    def record_gpu(self, sample: GpuSample) -> None:
        """Queue a GPU sample (`records.GpuRecorder`); never blocks, never raises."""

    @abc.abstractmethod
    async def flush(self) -> None:
        """Write everything queued so far (tests and shutdown)."""

    @property
    @abc.abstractmethod
    def pending(self) -> int:
        """Rows queued but not yet durable (the `specproxy_store_pending` gauge)."""

    @property
    @abc.abstractmethod
    def dropped(self) -> int:
        """Rows lost for good; must stay 0 (`specproxy_store_dropped_total`)."""

    @abc.abstractmethod
    async def write_stats(self, *, run_id: str, t: float, result: dict[str, Any]) -> None:
        """Append one stats-job result (JSON-able) to the history."""

    # -- reads (each backend) --------------------------------------------------------------------

    async def read_arrays(
        self,
        *,
        run_id: str,
        columns: Sequence[str],
        since: float | None = None,
        until: float | None = None,
        model: str | None = None,
        include_shadow: bool = True,
    ) -> dict[Arm, ArmArrays]:
        """Records of `run_id` with since <= t_start < until, per arm, as column arrays in
        t_start order; an unknown column is a `StoreError`."""
        query = RecordQuery(run_id, check_columns(columns), since, until, model, include_shadow)
        return await self._read_arrays(query)

    @abc.abstractmethod
    async def _read_arrays(self, query: RecordQuery) -> dict[Arm, ArmArrays]:
        """`read_arrays` for a checked query: both arms, one entry each."""

    @abc.abstractmethod
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
        """Per-minute rollups (see `specproxy.summary.minute`) of `metric` for minutes in
        [since_minute, until_minute), per arm, rows of every model when `model` is None (the
        caller sums them); `with_bins=False` reads only the per-minute summaries. Fine rows only:
        minutes already compacted into blocks are in `read_rollup_tiers`."""

    @abc.abstractmethod
    async def compact_rollups(self, *, run_id: str, now: float) -> int:
        """Fold the run's closed fine rollups into blocks and old 1-minute blocks into hour
        blocks (`store.compaction`, bounds from `StoreConfig.rollup_*`) in one transaction;
        return the rows taken. Only the stats leader calls it."""

    @abc.abstractmethod
    async def read_rollup_tiers(self, *, run_id: str, metric: str, known: TierVersions) -> TierRead:
        """Every rollup block and fine minute of `metric` from one snapshot: keys and `n` of all,
        contents of those whose `n` is not what `known` holds (`store.rollups.TierRead`)."""

    @abc.abstractmethod
    async def read_moments(self, *, run_id: str, since_minute: int) -> MomentRead:
        """The run's length-adjustment moments (`store.moments`): every hour row, and the minute
        rows from `since_minute` on."""

    @abc.abstractmethod
    async def read_engine_samples(
        self, *, run_id: str, since: float | None = None, arm: Arm | None = None
    ) -> list[EngineSample]:
        """Engine samples in time order (restart markers included)."""

    @abc.abstractmethod
    async def read_engine_aggregates(
        self, *, run_id: str, since: Sequence[float]
    ) -> dict[float, dict[Arm, EngineAggregate]]:
        """Per window start in `since` (-inf: the whole run) and per arm, the aggregate of the
        engine samples at or after it (`engineagg.EngineAggregate`; empty for an arm without
        any), computed by the store: a tick never decodes every sample of a long run."""

    @abc.abstractmethod
    async def read_restart_samples(self, *, run_id: str) -> list[EngineSample]:
        """The samples that date the run's restarts (`engineagg.restart_evidence` of each arm),
        in time order: what `stats.clean.restart_times` needs, read by index."""

    @abc.abstractmethod
    async def read_gpu_samples(
        self, *, run_id: str, since: float | None = None, limit: int | None = None
    ) -> dict[Arm, list[GpuSample]]:
        """GPU samples with t >= since, per arm the newest `limit` (all when None) in time
        order; only arms that have any (`schema.gpu_by_arm`)."""

    @abc.abstractmethod
    async def read_stats_history(
        self, *, run_id: str, since: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        """Stats-job results in time order, for reports."""

    @abc.abstractmethod
    async def models(self, *, run_id: str) -> list[str]:
        """Distinct models seen in a run."""

    @abc.abstractmethod
    async def run_ids(self) -> list[str]:
        """Distinct run ids in the store."""

    @abc.abstractmethod
    def export_chunks(
        self, *, run_id: str | None = None, chunk_rows: int = 10_000
    ) -> AsyncIterator[list[tuple[Any, ...]]]:
        """Stored records as tuples in `schema.REQUEST_COLUMNS` order, in chunks (export)."""
