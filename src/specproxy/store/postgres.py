"""`postgresql://...`: the shared store when several proxy replicas record into one database.

Batches go in with binary COPY into a per-connection temporary table and one
`INSERT ... SELECT ... ON CONFLICT DO NOTHING`, which is several times faster than row inserts and
keeps replays of spill files idempotent. Migrations take a transaction-scoped advisory lock, so
replicas starting together upgrade the schema exactly once. asyncpg is imported lazily: it is an
optional dependency (`specproxy[postgres]`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any

from specproxy.config import StoreConfig
from specproxy.control.events import ArmEvent
from specproxy.errors import StoreError
from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.store import armevents
from specproxy.store.aggregates import (
    AGGREGATES,
    Inserted,
    RollupCut,
    RowsCut,
    aggregate_rows,
    retention_sql,
    upsert_sql,
)
from specproxy.store.buffered import FOLD_BATCH_ROWS, BufferedStore
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
from specproxy.store.migrations import migrations_after
from specproxy.store.queries import (
    MODELS_SQL,
    RUN_IDS_SQL,
    RecordQuery,
    aggregate_queries,
    arms_sql,
    engine_aggregate_from,
    engine_sql,
    export_sql,
    gpu_sql,
    latest_stats_sql,
    placeholders,
    records_sql,
    restart_plan,
    stats_history_sql,
    with_arm,
)
from specproxy.store.registry import register_backend
from specproxy.store.rollups import (
    block_blobs_sql,
    block_list_sql,
    changed_blocks,
    changed_minutes,
    delete_blocks_before_sql,
    delete_blocks_returning_sql,
    delete_fine_returning_sql,
    fine_bins_of_minute_sql,
    fine_minutes_sql,
    read_moments_sql,
    stored_block_sql,
    take_pending_sql,
    upsert_block_sql,
)
from specproxy.store.schema import (
    ENGINE_COLUMNS,
    GPU_COLUMNS,
    REQUEST_COLUMNS,
    engine_row,
    gpu_by_arm,
    gpu_row,
    gpu_sample,
    request_record,
    request_row,
)
from specproxy.summary.engine import EngineAggregate, StoredView
from specproxy.summary.minute import STORED_METRICS
from specproxy.summary.tiering import CompactionBounds

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PostgresStore", "migrate_postgres"]

CONNECT_TIMEOUT_S = 5.0
COMMAND_TIMEOUT_S = 30.0
MIGRATION_LOCK_KEY = 0x5BEC_0001  # pg_advisory_xact_lock key shared by every replica
COMPACTION_LOCK_KEY = 0x5BEC_0002  # one rollup compaction at a time (leader hand-over)

_COLS = ", ".join(REQUEST_COLUMNS)
_ENGINE_COLS = ", ".join(ENGINE_COLUMNS)
_TEMP_TABLES = (
    # with the defaults: the copy leaves out `rollup_pending` (NOT NULL)
    "CREATE TEMP TABLE incoming_requests (LIKE requests INCLUDING DEFAULTS) ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE incoming_engine (LIKE engine_samples) ON COMMIT DELETE ROWS",
)
# RETURNING names the rows actually inserted, so only they are rolled up (a replayed batch's
# duplicates are not added to the rollups twice)
_MOVE_REQUESTS = (
    f"INSERT INTO requests ({_COLS}) SELECT {_COLS} FROM incoming_requests ON CONFLICT DO NOTHING "
    "RETURNING run_id, request_id, arm, shadow"
)
# a deferred write's rows: pending until the stats leader rolls them up (`fold_pending`)
_MOVE_PENDING = (
    f"INSERT INTO requests ({_COLS}, rollup_pending) SELECT {_COLS}, true FROM incoming_requests "
    "ON CONFLICT DO NOTHING"
)
_MOVE_ENGINE = (
    f"INSERT INTO engine_samples ({_ENGINE_COLS}) SELECT {_ENGINE_COLS} FROM incoming_engine "
    f"ON CONFLICT DO NOTHING RETURNING {_ENGINE_COLS}"  # the inserted samples join their hour
)

# GPU samples are one row per arm and scrape: a plain multi-row insert, no COPY staging table
_INSERT_GPU = (
    f"INSERT INTO gpu_samples ({', '.join(GPU_COLUMNS)}) "
    f"VALUES ({', '.join(f'${i}' for i in range(1, len(GPU_COLUMNS) + 1))}) "
    "ON CONFLICT DO NOTHING"
)


def _asyncpg() -> Any:
    try:
        import asyncpg
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise StoreError(
            "postgresql:// stores need asyncpg: pip install 'specproxy[postgres]'"
        ) from exc
    return asyncpg


async def migrate_postgres(conn: asyncpg.Connection) -> int:
    """Bring the schema to SCHEMA_VERSION under an advisory lock; return the version found."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        exists = await conn.fetchval("SELECT to_regclass('schema_version') IS NOT NULL")
        found = 0
        if exists:
            found = await conn.fetchval("SELECT COALESCE(MAX(version), 0) FROM schema_version")
        for migration in migrations_after(found):
            for statement in migration.statements("postgresql"):
                await conn.execute(statement)
            await conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES ($1, $2)",
                migration.version,
                time.time(),
            )
    return int(found)


async def _init_connection(conn: asyncpg.Connection) -> None:
    for statement in _TEMP_TABLES:
        await conn.execute(statement)


@register_backend("postgresql", "postgres")
class PostgresStore(BufferedStore):
    def __init__(self, cfg: StoreConfig, *, run_id: str = "default") -> None:
        super().__init__(cfg, run_id=run_id)
        self.dsn = cfg.url
        self._pool: asyncpg.Pool | None = None

    async def _open(self) -> None:
        asyncpg = _asyncpg()
        conn = await asyncpg.connect(self.dsn, timeout=CONNECT_TIMEOUT_S)
        try:
            await migrate_postgres(conn)
        finally:
            await conn.close()
        self._pool = await asyncpg.create_pool(
            self.dsn,
            min_size=1,
            max_size=4,
            timeout=CONNECT_TIMEOUT_S,
            command_timeout=COMMAND_TIMEOUT_S,
            init=_init_connection,
        )

    @property
    def pool(self) -> asyncpg.Pool:
        if self._pool is None:
            raise StoreError("postgresql store is not open")
        return self._pool

    async def _write(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            inserted: list[RequestRecord] = []
            if requests:
                await conn.copy_records_to_table(
                    "incoming_requests",
                    records=[request_row(r) for r in requests],
                    columns=REQUEST_COLUMNS,
                )
            if requests and self.deferred:  # duplicates ignored; the leader rolls them up
                await conn.execute(_MOVE_PENDING)
            elif requests:
                new = {
                    (r["run_id"], r["request_id"], r["arm"], r["shadow"])
                    for r in await conn.fetch(_MOVE_REQUESTS)
                }
                inserted = [r for r in requests if (r.run_id, r.request_id, r.arm, r.shadow) in new]
            taken: list[EngineSample] = []
            if engine:
                await conn.copy_records_to_table(
                    "incoming_engine",
                    records=[engine_row(s, "postgresql") for s in engine],
                    columns=ENGINE_COLUMNS,
                )
                taken = [EngineSample.from_dict(dict(r)) for r in await conn.fetch(_MOVE_ENGINE)]
            pairs = await asyncio.to_thread(
                aggregate_rows, Inserted(inserted, taken, self._model_label)
            )
            for aggregate, rows in pairs:
                await conn.executemany(upsert_sql(aggregate, "postgresql"), rows)
            if gpu:
                await conn.executemany(_INSERT_GPU, [gpu_row(g) for g in gpu])

    async def _purge(self, before: float) -> int:
        removed = 0
        async with self.pool.acquire() as conn, conn.transaction():
            for sql in (
                # a row still pending stays until it is rolled up (`fold_pending`)
                "DELETE FROM requests WHERE t_start < $1 AND NOT rollup_pending",
                "DELETE FROM engine_samples WHERE t < $1",
                "DELETE FROM gpu_samples WHERE t < $1",
                "DELETE FROM stats_history WHERE t < $1",
            ):
                status = await conn.execute(sql, before)
                removed += int(status.split()[-1])
            for aggregate in AGGREGATES:  # rebuilt from the rows kept
                if isinstance(aggregate.retention, RowsCut):
                    for sql in retention_sql(aggregate, "postgresql"):
                        await conn.execute(sql, before)
        return removed

    async def _purge_rollups(self, before_minute: int) -> int:
        removed = 0
        async with self.pool.acquire() as conn, conn.transaction():
            statements = [delete_blocks_before_sql("postgresql")] + [
                sql
                for aggregate in AGGREGATES
                if isinstance(aggregate.retention, RollupCut)
                for sql in retention_sql(aggregate, "postgresql")
            ]
            for sql in statements:
                status = await conn.execute(sql, before_minute)
                removed += int(status.split()[-1])
        return removed

    async def _fold_pending(self) -> int:
        folded = 0
        while True:
            async with self.pool.acquire() as conn, conn.transaction():
                rows = await conn.fetch(take_pending_sql("postgresql"), FOLD_BATCH_ROWS)
                records = [request_record(tuple(r)) for r in rows]
                pairs = await asyncio.to_thread(
                    aggregate_rows, Inserted(records, (), self._model_label)
                )
                for aggregate, agg_rows in pairs:
                    await conn.executemany(upsert_sql(aggregate, "postgresql"), agg_rows)
            folded += len(rows)
            if len(rows) < FOLD_BATCH_ROWS:
                return folded

    async def _compact(self, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        """One REPEATABLE READ transaction: the DELETE ... RETURNING statements see one snapshot;
        a row a replica changes meanwhile aborts the pass (serialization failure, retried at the
        next one) and a row it adds is left for the next pass."""
        async with self.pool.acquire() as conn, conn.transaction(isolation="repeatable_read"):
            if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", COMPACTION_LOCK_KEY):
                return 0
            blocks: list[Any] = []
            sums: list[Any] = []
            bins: list[Any] = []
            sums_sql, bins_sql = delete_fine_returning_sql("postgresql")
            for metric in STORED_METRICS:
                blocks += await conn.fetch(
                    delete_blocks_returning_sql("postgresql"),
                    run_id,
                    metric,
                    bounds.blocks_before(metric),
                )
                sums += await conn.fetch(sums_sql, run_id, metric, bounds.fine_before)
                bins += await conn.fetch(bins_sql, run_id, metric, bounds.fine_before)
            targets = {
                (m, *bounds.target(minute), mo, a)
                for m, minute, mo, a, *_ in [*sums, *bins]
                if not bounds.dropped(m, minute)
            } | {
                (m, st - st % 60, 60, mo, a)
                for m, st, mo, a, _b in blocks
                if not bounds.dropped(m, st)
            }
            stored: dict[tuple[str, int, int, str, str], bytes] = {}
            for target in targets:
                blob = await conn.fetchval(stored_block_sql("postgresql"), run_id, *target)
                if blob is not None:
                    stored[target] = bytes(blob)
            folded = await asyncio.to_thread(
                fold,
                bounds=bounds,
                minute_blocks=[tuple(r) for r in blocks],
                summaries=[tuple(r) for r in sums],
                bins=[tuple(r) for r in bins],
                stored=stored.get,
            )
            await conn.executemany(
                upsert_block_sql("postgresql"),
                [(run_id, m, st, sp, mo, a, b.n, b.encode()) for m, st, sp, mo, a, b in folded],
            )
            return len(blocks) + len(sums) + len(bins)

    async def read_tiers(self, *, run_id: str, metric: str, known: TierVersions) -> TierRead:
        await self._ensure_open()
        try:
            async with (
                self.pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):  # one snapshot: a compaction commits wholly before or after
                listing = [
                    tuple(r) for r in await conn.fetch(block_list_sql("postgresql"), run_id, metric)
                ]
                changed = changed_blocks(listing, known)
                blobs: dict[BlockKey, bytes] = {}
                if len(changed) > 64:  # a cold reader: one scan instead of a query per block
                    wanted = set(changed)
                    for st, sp, mo, a, blob in await conn.fetch(
                        block_blobs_sql("postgresql", one=False), run_id, metric
                    ):
                        if (st, sp, mo, a) in wanted:
                            blobs[(st, sp, mo, a)] = bytes(blob)
                else:
                    for key in changed:
                        for st, sp, mo, a, blob in await conn.fetch(
                            block_blobs_sql("postgresql", one=True), run_id, metric, *key
                        ):
                            blobs[(st, sp, mo, a)] = bytes(blob)
                minutes = [
                    tuple(r)
                    for r in await conn.fetch(fine_minutes_sql("postgresql"), run_id, metric)
                ]
                bins: dict[FineKey, tuple[Packed, Packed]] = {}
                for minute in changed_minutes(minutes, known):
                    for model, arm, packed_bins, packed_counts in await conn.fetch(
                        fine_bins_of_minute_sql("postgresql"), run_id, metric, minute
                    ):
                        bins[(minute, model, arm)] = (bytes(packed_bins), bytes(packed_counts))
        except Exception as exc:
            raise StoreError(f"cannot read store: {exc}") from exc
        return TierRead(listing, blobs, minutes, bins)

    async def read_moments(self, *, run_id: str, since_minute: int) -> MomentRead:
        await self._ensure_open()
        try:
            async with (
                self.pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):  # one snapshot of both tables
                hours = await conn.fetch(read_moments_sql("postgresql", hours=True), run_id)
                minutes = await conn.fetch(
                    read_moments_sql("postgresql", hours=False), run_id, since_minute
                )
        except Exception as exc:
            raise StoreError(f"cannot read store: {exc}") from exc
        return MomentRead([tuple(r) for r in hours], [tuple(r) for r in minutes])

    async def _close_backend(self) -> None:
        if self._pool is not None:
            pool, self._pool = self._pool, None
            try:
                await asyncio.wait_for(pool.close(), CONNECT_TIMEOUT_S)
            except TimeoutError:
                pool.terminate()

    def _rejects_rows(self, exc: BaseException) -> bool:
        errors = _asyncpg().exceptions
        bad_data = (errors.DataError, errors.IntegrityConstraintViolationError)
        return super()._rejects_rows(exc) or isinstance(exc, bad_data)

    def _is_misconfigured(self, exc: BaseException) -> bool:
        errors = _asyncpg().exceptions
        fatal = (
            errors.InvalidAuthorizationSpecificationError,  # bad user or password
            errors.InvalidCatalogNameError,  # no such database
            errors.InsufficientPrivilegeError,
        )
        return isinstance(exc, fatal)

    async def write_stats(self, *, run_id: str, t: float, result: dict[str, Any]) -> None:
        await self._ensure_open()
        try:
            await self.pool.execute(
                "INSERT INTO stats_history (run_id, t, result) VALUES ($1, $2, $3::jsonb)",
                run_id,
                t,
                json.dumps(result),
            )
        except Exception as exc:
            raise StoreError(f"cannot write stats: {exc}") from exc

    async def add_arm_event(self, event: ArmEvent) -> ArmEvent:
        await self._ensure_open()
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                await conn.execute(armevents.INSERT_LOCK_SQL)  # ids visible in order
                id_ = await conn.fetchval(
                    armevents.insert_sql("postgresql"), *armevents.event_params(event)
                )
        except Exception as exc:
            raise StoreError(f"cannot write arm event: {exc}") from exc
        return dataclasses.replace(event, id=int(id_))

    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]:
        rows = await self._fetch(armevents.select_sql("postgresql"), run_id, after_id)
        return [armevents.event_from_row(tuple(r)) for r in rows]

    async def _fetch(self, sql: str, *params: Any) -> list[Any]:
        await self._ensure_open()
        try:
            return list(await self.pool.fetch(sql, *params))
        except Exception as exc:
            raise StoreError(f"cannot read store: {exc}") from exc

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
        query = RecordQuery.of(run_id, columns, since, until, usable_only, ended_since, ended_until)
        sql, params = records_sql(query, "postgresql")
        await self._ensure_open()
        out: dict[Arm, list[Row]] = {}
        try:  # both arms from one snapshot
            async with (
                self.pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                arms_q, arms_p = arms_sql("requests", run_id, "postgresql")
                for (arm,) in await conn.fetch(arms_q, *arms_p):
                    out[arm] = [tuple(r) for r in await conn.fetch(sql, *with_arm(params, arm))]
        except Exception as exc:
            raise StoreError(f"cannot read store: {exc}") from exc
        return out

    async def read_engine_samples(
        self, *, run_id: str, since: float | None = None, arm: Arm | None = None
    ) -> list[EngineSample]:
        sql, params = engine_sql(run_id, since, arm, "postgresql")
        return [EngineSample.from_dict(dict(r)) for r in await self._fetch(sql, *params)]

    async def read_engine(self, *, run_id: str, since: Sequence[float]) -> StoredView:
        await self._ensure_open()
        aggregates: dict[float, dict[Arm, EngineAggregate]] = {}
        try:  # one snapshot: samples and hours written together
            async with (
                self.pool.acquire() as conn,
                conn.transaction(isolation="repeatable_read", readonly=True),
            ):
                arms_q, arms_p = arms_sql("engine_samples", run_id, "postgresql")
                arms = [r[0] for r in await conn.fetch(arms_q, *arms_p)]
                for start in since:
                    aggregates[start] = {}
                    for arm in arms:
                        total = EngineAggregate()
                        for sql, params in aggregate_queries(run_id, arm, start, "postgresql"):
                            row = await conn.fetchrow(sql, *params)
                            assert row is not None  # an aggregate always has one row
                            total = total.merge(engine_aggregate_from(tuple(row)))
                        aggregates[start][arm] = total
                plan = restart_plan(run_id, "postgresql")
                try:
                    sql, params = next(plan)
                    while True:
                        fetched = await conn.fetch(sql, *params)
                        sql, params = plan.send([tuple(r) for r in fetched])
                except StopIteration as done:
                    rows = done.value
        except Exception as exc:
            raise StoreError(f"cannot read store: {exc}") from exc
        restarts = sorted(
            (EngineSample.from_dict(dict(zip(ENGINE_COLUMNS, r, strict=True))) for r in rows),
            key=lambda s: s.t,
        )
        return StoredView(aggregates, restarts)

    async def read_gpu_samples(
        self, *, run_id: str, since: float | None = None, limit: int | None = None
    ) -> dict[Arm, list[GpuSample]]:
        rows = []
        arms_q, arms_p = arms_sql("gpu_samples", run_id, "postgresql")
        for (arm,) in await self._fetch(arms_q, *arms_p):
            sql, params = gpu_sql(run_id, arm, since, limit, "postgresql")
            rows.extend(await self._fetch(sql, *params))
        # tens of thousands of samples per tick: decoded off the event loop
        return await asyncio.to_thread(lambda: gpu_by_arm(gpu_sample(tuple(r)) for r in rows))

    async def read_stats_history(
        self, *, run_id: str, since: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        sql, params = stats_history_sql(run_id, since, "postgresql")
        return [(r["t"], json.loads(r["result"])) for r in await self._fetch(sql, *params)]

    async def latest_stats(
        self, *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None:
        sql, params = latest_stats_sql(run_id, newer_than, "postgresql")
        rows = await self._fetch(sql, *params)
        return (rows[0]["t"], json.loads(rows[0]["result"])) if rows else None

    async def models(self, *, run_id: str) -> list[str]:
        sql = placeholders(MODELS_SQL, "postgresql")
        return [r["model"] for r in await self._fetch(sql, run_id)]

    async def run_ids(self) -> list[str]:
        return [r["run_id"] for r in await self._fetch(RUN_IDS_SQL)]

    async def export_chunks(
        self, *, run_id: str | None = None, chunk_rows: int = 10_000
    ) -> AsyncIterator[list[tuple[Any, ...]]]:
        await self._ensure_open()
        sql, params = export_sql(run_id, "postgresql")
        async with self.pool.acquire() as conn, conn.transaction():
            chunk: list[tuple[Any, ...]] = []
            async for record in conn.cursor(sql, *params, prefetch=chunk_rows):
                chunk.append(tuple(record))
                if len(chunk) >= chunk_rows:
                    yield chunk
                    chunk = []
            if chunk:
                yield chunk
