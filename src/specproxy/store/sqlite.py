"""`sqlite:///path/specproxy.db`: the embedded default store (WAL mode, one writer thread).

All writes go through one dedicated thread that owns the write connection, so the event loop never
touches the disk and writes are serialized as SQLite wants. Reads open their own short-lived
connection in a worker thread (the standard library's sqlite3 only); WAL lets them run while the
writer commits, and a read of several statements runs in one transaction (one snapshot).
`synchronous=NORMAL` under WAL survives a crash of the process (not of the OS) without an fsync
per commit.

SIGBUS. WAL keeps its index in `<db>-shm`, which SQLite maps into memory; a process whose
mapped `-shm` is truncated under it (another program, a cleanup job, a disk tool) dies of SIGBUS
on its next statement, with no log line and its buffered rows lost (issue 29, defect 5). The
kernel gives no error code to catch, so every statement checks first (`ShmGuard`, one `stat`):
a `-shm` smaller than this process has seen it makes the store unsafe for good. From then on
nothing touches SQLite: writes fail, so the rows go to the spill file (`buffered`); reads fail
with `StoreError`; the process logs it once at CRITICAL, keeps serving, and at exit skips the
close that would touch the map (`os._exit(EXIT_UNSAFE)`, after the spill is written); a restart
reopens the database, whose WAL is intact, and replays the spill. A truncation in the instant
between the check and the statement still kills the process; this narrows it from the whole
outage to microseconds, and `faulthandler` (enabled by `specproxy serve`) names the signal.

URL form (as SQLAlchemy): `sqlite:///relative.db`, `sqlite:////absolute/path.db`; the optional
query `?timeout=SECONDS` sets how long a write waits for a lock before it counts as an outage.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import functools
import json
import logging
import os
import sqlite3
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ClassVar, Final, TypeVar
from urllib.parse import parse_qs, urlsplit

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
    BOOL_CONVERTER,
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

__all__ = ["SqliteStore", "migrate_sqlite", "require_existing_store", "sqlite_path"]

log = logging.getLogger(__name__)

_T = TypeVar("_T")

DEFAULT_TIMEOUT_S = 5.0

_INSERT_REQUEST = (
    f"INSERT INTO requests ({', '.join(REQUEST_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in REQUEST_COLUMNS)}) ON CONFLICT DO NOTHING"
)
# a deferred write's rows: pending until the stats leader rolls them up (`fold_pending`)
_INSERT_PENDING = (
    f"INSERT INTO requests ({', '.join(REQUEST_COLUMNS)}, rollup_pending) "
    f"VALUES ({', '.join('?' for _ in REQUEST_COLUMNS)}, 1) ON CONFLICT DO NOTHING"
)
_INSERT_ENGINE = (
    f"INSERT INTO engine_samples ({', '.join(ENGINE_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in ENGINE_COLUMNS)}) ON CONFLICT DO NOTHING"
)

_INSERT_GPU = (
    f"INSERT INTO gpu_samples ({', '.join(GPU_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in GPU_COLUMNS)}) ON CONFLICT DO NOTHING"
)


# booleans (0/1) of `read_records` as bool, by column name (`queries.records_sql`)
sqlite3.register_converter(BOOL_CONVERTER, lambda value: value != b"0")


def sqlite_path(url: str) -> tuple[str, float]:
    """The file path and lock timeout of a `sqlite://` URL."""
    parts = urlsplit(url)
    if parts.scheme != "sqlite" or parts.netloc:
        raise StoreError(f"not a sqlite:/// URL: {url!r}")
    path = parts.path[1:] if parts.path.startswith("/") else parts.path
    if not path:
        raise StoreError(f"sqlite URL has no file path: {url!r}")
    timeout = DEFAULT_TIMEOUT_S
    query = parse_qs(parts.query)
    if "timeout" in query:
        try:
            timeout = float(query["timeout"][0])
        except ValueError as exc:
            raise StoreError(f"sqlite URL timeout must be a number: {url!r}") from exc
    return path, timeout


def require_existing_store(url: str) -> None:
    """For read-only commands (stats, report, export): a missing SQLite file is an error, never
    created. Other schemes are checked when they connect."""
    if urlsplit(url).scheme == "sqlite" and not os.path.isfile(sqlite_path(url)[0]):
        raise StoreError(f"no store at {url}")


def migrate_sqlite(conn: sqlite3.Connection) -> int:
    """Bring the schema to SCHEMA_VERSION in one transaction; return the version found."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        has_table = conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'"
        ).fetchone()
        found = 0
        if has_table:
            found = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[
                0
            ]
        for migration in migrations_after(found):
            for statement in migration.statements("sqlite"):
                conn.execute(statement)
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (migration.version, time.time()),
            )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return int(found)


def _engine_sample(row: Sequence[Any]) -> EngineSample:
    """A row in `ENGINE_COLUMNS` order (SQLite: integer booleans, positions as JSON text)."""
    values = dict(zip(ENGINE_COLUMNS, row, strict=True))
    values["up"] = bool(values["up"])
    values["restarted"] = bool(values["restarted"])
    pos = values["position_acceptance"]
    values["position_acceptance"] = json.loads(pos) if pos is not None else None
    return EngineSample.from_dict(values)


WAL_SIZE_LIMIT_BYTES: Final = 64 * 1024 * 1024  # the WAL kept on disk after a checkpoint
EXIT_UNSAFE: Final = 75  # EX_TEMPFAIL: the exit status after the -shm became unsafe
_UNCLOSED: list[sqlite3.Connection] = []  # connections an unsafe -shm keeps from closing


class ShmGuard:
    """Whether SQLite may touch the database's mapped `-shm` (see the module docstring): `check`
    raises `StoreError` once the file is smaller than this process has seen it. One per process
    and database file: every connection of a process shares SQLite's one map, which the store's
    long-lived connection (the writer's, or a read-only store's) keeps mapped."""

    _guards: ClassVar[dict[str, ShmGuard]] = {}

    def __init__(self, db_path: str) -> None:
        self.shm = db_path + "-shm"
        self.seen = 0  # the largest size seen of the mapped file
        self.inode: tuple[int, int] | None = None  # (st_dev, st_ino) of the mapped file
        self.unsafe: str | None = None

    @classmethod
    def of(cls, db_path: str) -> ShmGuard:
        key = os.path.realpath(db_path)
        guard = cls._guards.get(key)
        if guard is None:
            guard = cls._guards[key] = cls(key)
        return guard

    def check(self) -> None:
        if self.unsafe is not None:
            raise StoreError(self.unsafe)
        try:
            st = os.stat(self.shm)
        except OSError:  # not made yet, or unlinked (the mapped inode stays valid), or unreadable
            return
        if (st.st_dev, st.st_ino) != self.inode or st.st_size >= self.seen:
            return  # another file at the path is not the one mapped; a map only grows
        self.unsafe = (
            f"SQLite's {self.shm} shrank from {self.seen} to {st.st_size} bytes under this "
            "process (something outside specproxy truncated it): touching the database again "
            "would crash the process (SIGBUS), so the store is closed to it; rows go to the "
            "spill file, and a restart reopens the database and replays them"
        )
        log.critical("store: %s", self.unsafe)
        atexit.register(_exit_without_closing)
        raise StoreError(self.unsafe)

    def mapped(self) -> None:
        """After a statement: note the file SQLite has mapped and its size (which only grows
        while a connection is open)."""
        try:
            st = os.stat(self.shm)
        except OSError:
            return
        inode = (st.st_dev, st.st_ino)
        self.seen = max(self.seen, st.st_size) if inode == self.inode else st.st_size
        self.inode = inode


def _exit_without_closing() -> None:
    """At exit after a `-shm` truncation: closing the connections would checkpoint through the
    poisoned map and die of SIGBUS, so end the process here, after the spill was written."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_UNSAFE)


@register_backend("sqlite")
class SqliteStore(BufferedStore):
    def __init__(self, cfg: StoreConfig, *, run_id: str = "default") -> None:
        super().__init__(cfg, run_id=run_id)
        self.path, self.timeout_s = sqlite_path(cfg.url)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="specproxy-sqlite-writer")
        self._conn: sqlite3.Connection | None = None  # used only on the writer thread
        self._shm = ShmGuard.of(self.path)

    # -- writer thread -------------------------------------------------------------------------

    async def _on_writer(self, fn: Callable[..., _T], *args: Any) -> _T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, functools.partial(fn, *args))

    def _connect(self) -> sqlite3.Connection:
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        # After a checkpoint resets it, the WAL file shrinks back to this size (SQLite's default
        # keeps it at its high-water mark: the size it reached during an outage or a long read)
        conn.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT_BYTES}")
        return conn

    def _open_sync(self) -> None:
        self._shm.check()
        if self._read_only and self._schema_is_current():
            # stats / report / export: a read-only connection, nothing to migrate
            self._conn = sqlite3.connect(
                f"file:{Path(self.path).resolve()}?mode=ro", uri=True, timeout=self.timeout_s
            )
            return
        conn = self._connect()
        try:
            migrate_sqlite(conn)
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        self._shm.mapped()

    def _schema_is_current(self) -> bool:
        """Whether the file exists and needs no migration (an older one is migrated first)."""
        if not Path(self.path).is_file():
            return False
        uri = f"file:{Path(self.path).resolve()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=self.timeout_s)) as conn:
            try:
                query = "SELECT COALESCE(MAX(version), 0) FROM schema_version"
                row = conn.execute(query).fetchone()
            except sqlite3.OperationalError:  # no schema_version table yet
                return False
            return not migrations_after(int(row[0]))

    async def _open(self) -> None:
        await self._on_writer(self._open_sync)

    def _in_transaction(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        conn = self._conn
        if conn is None:
            raise sqlite3.OperationalError("store not open")
        self._shm.check()
        conn.execute("BEGIN IMMEDIATE")
        try:
            result = fn(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._shm.mapped()
        return result

    def _write_sync(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        deferred = self.deferred

        def insert(conn: sqlite3.Connection) -> None:
            new: list[RequestRecord] = []
            if deferred:  # duplicates ignored; the leader rolls the rows up
                insert_rows(conn, _INSERT_PENDING, [request_row(r) for r in requests])
            elif requests:
                new = _insert_requests(conn, requests)
            inserted = Inserted(
                new,
                # row by row: only the samples inserted (not duplicates) join their hour
                [
                    s
                    for s in engine
                    if conn.execute(_INSERT_ENGINE, engine_row(s, "sqlite")).rowcount
                ],
                self._model_label,
            )
            for aggregate, rows in aggregate_rows(inserted):
                insert_rows(conn, upsert_sql(aggregate, "sqlite"), rows)
            if gpu:
                conn.executemany(_INSERT_GPU, [gpu_row(g) for g in gpu])

        self._in_transaction(insert)

    async def _write(
        self, requests: list[RequestRecord], engine: list[EngineSample], gpu: list[GpuSample]
    ) -> None:
        await self._on_writer(self._write_sync, requests, engine, gpu)

    def _purge_sync(self, before: float) -> int:
        def delete(conn: sqlite3.Connection) -> int:
            removed = 0
            for sql in (
                # a row still pending stays until it is rolled up (`fold_pending`)
                "DELETE FROM requests WHERE t_start < ? AND rollup_pending = 0",
                "DELETE FROM engine_samples WHERE t < ?",
                "DELETE FROM gpu_samples WHERE t < ?",
                "DELETE FROM stats_history WHERE t < ?",
            ):
                removed += conn.execute(sql, (before,)).rowcount
            for aggregate in AGGREGATES:  # rebuilt from the rows kept
                if isinstance(aggregate.retention, RowsCut):
                    for sql in retention_sql(aggregate, "sqlite"):
                        conn.execute(sql, (before,))
            return removed

        return self._in_transaction(delete)

    async def _purge(self, before: float) -> int:
        return await self._on_writer(self._purge_sync, before)

    def _purge_rollups_sync(self, before_minute: int) -> int:
        def delete(conn: sqlite3.Connection) -> int:
            statements = [delete_blocks_before_sql("sqlite")] + [
                sql
                for aggregate in AGGREGATES
                if isinstance(aggregate.retention, RollupCut)
                for sql in retention_sql(aggregate, "sqlite")
            ]
            return sum(conn.execute(sql, (before_minute,)).rowcount for sql in statements)

        return self._in_transaction(delete)

    async def _purge_rollups(self, before_minute: int) -> int:
        return await self._on_writer(self._purge_rollups_sync, before_minute)

    def _fold_pending_sync(self) -> int:
        def fold(conn: sqlite3.Connection) -> int:
            rows = conn.execute(take_pending_sql("sqlite"), (FOLD_BATCH_ROWS,)).fetchall()
            records = [request_record(row) for row in rows]
            for aggregate, agg_rows in aggregate_rows(Inserted(records, (), self._model_label)):
                insert_rows(conn, upsert_sql(aggregate, "sqlite"), agg_rows)
            return len(rows)

        folded = 0
        while True:
            n = self._in_transaction(fold)
            folded += n
            if n < FOLD_BATCH_ROWS:
                return folded

    async def _fold_pending(self) -> int:
        return await self._on_writer(self._fold_pending_sync)

    def _compact_sync(self, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        def move(conn: sqlite3.Connection) -> int:
            blocks: list[Any] = []
            sums: list[Any] = []
            bins: list[Any] = []
            sums_sql, bins_sql = delete_fine_returning_sql("sqlite")
            for metric in STORED_METRICS:
                key = (run_id, metric)
                blocks += conn.execute(
                    delete_blocks_returning_sql("sqlite"), (*key, bounds.blocks_before(metric))
                ).fetchall()
                sums += conn.execute(sums_sql, (*key, bounds.fine_before)).fetchall()
                bins += conn.execute(bins_sql, (*key, bounds.fine_before)).fetchall()

            def stored(target: tuple[str, int, int, str, str]) -> bytes | None:
                row = conn.execute(stored_block_sql("sqlite"), (run_id, *target)).fetchone()
                return bytes(row[0]) if row else None

            folded = fold(
                bounds=bounds, minute_blocks=blocks, summaries=sums, bins=bins, stored=stored
            )
            conn.executemany(
                upsert_block_sql("sqlite"),
                [(run_id, m, st, sp, mo, a, b.n, b.encode()) for m, st, sp, mo, a, b in folded],
            )
            return len(blocks) + len(sums) + len(bins)

        return self._in_transaction(move)

    async def _compact(self, run_id: str, bounds: CompactionBounds, fold: Fold) -> int:
        return await self._on_writer(self._compact_sync, run_id, bounds, fold)

    def _close_sync(self) -> None:
        if self._conn is not None and self._shm.unsafe is not None:
            _UNCLOSED.append(self._conn)  # closing would touch the map; the exit skips it
            self._conn = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    async def _close_backend(self) -> None:
        await self._on_writer(self._close_sync)
        self._writer.shutdown(wait=True)

    def _rejects_rows(self, exc: BaseException) -> bool:
        bad_data = (sqlite3.IntegrityError, sqlite3.DataError, sqlite3.InterfaceError)
        return super()._rejects_rows(exc) or isinstance(exc, bad_data)

    async def write_stats(self, *, run_id: str, t: float, result: dict[str, Any]) -> None:
        await self._ensure_open()
        body = json.dumps(result)

        def insert(conn: sqlite3.Connection) -> None:
            conn.execute(
                "INSERT INTO stats_history (run_id, t, result) VALUES (?, ?, ?)", (run_id, t, body)
            )

        try:
            await self._on_writer(self._in_transaction, insert)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write stats: {exc}") from exc

    async def add_arm_event(self, event: ArmEvent) -> ArmEvent:
        await self._ensure_open()

        def insert(conn: sqlite3.Connection) -> int:
            cursor = conn.execute(armevents.insert_sql("sqlite"), armevents.event_params(event))
            assert cursor.lastrowid is not None
            return cursor.lastrowid

        try:
            id_ = await self._on_writer(self._in_transaction, insert)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot write arm event: {exc}") from exc
        return dataclasses.replace(event, id=id_)

    # -- reads (worker threads, own connections) -----------------------------------------------

    async def _read(self, fn: Callable[[sqlite3.Connection], _T], *, snapshot: bool = False) -> _T:
        """`fn` on a connection of its own in a worker thread; `snapshot`: inside one read
        transaction (every statement sees the same commits)."""
        await self._ensure_open()

        def run() -> _T:
            self._shm.check()
            conn = sqlite3.connect(
                self.path, timeout=self.timeout_s, detect_types=sqlite3.PARSE_COLNAMES
            )
            try:
                conn.execute("PRAGMA query_only=1")
                if not snapshot:
                    return fn(conn)
                conn.execute("BEGIN")
                try:
                    return fn(conn)
                finally:
                    conn.execute("ROLLBACK")
            finally:
                self._shm.mapped()
                conn.close()

        try:
            return await asyncio.to_thread(run)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot read store: {exc}") from exc

    async def read_tiers(self, *, run_id: str, metric: str, known: TierVersions) -> TierRead:
        # one snapshot: a compaction commits wholly before or after
        return await self._read(
            functools.partial(_read_tiers, run_id=run_id, metric=metric, known=known),
            snapshot=True,
        )

    async def read_moments(self, *, run_id: str, since_minute: int) -> MomentRead:
        def fetch(conn: sqlite3.Connection) -> MomentRead:
            hours = conn.execute(read_moments_sql("sqlite", hours=True), (run_id,)).fetchall()
            minutes = conn.execute(read_moments_sql("sqlite", hours=False), (run_id, since_minute))
            return MomentRead(hours, minutes.fetchall())

        return await self._read(fetch, snapshot=True)  # both tables from one snapshot

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
        sql, params = records_sql(
            RecordQuery.of(run_id, columns, since, until, usable_only, ended_since, ended_until),
            "sqlite",
        )

        def fetch(conn: sqlite3.Connection) -> dict[Arm, list[Row]]:
            arms = _arms(conn, "requests", run_id)
            return {arm: conn.execute(sql, with_arm(params, arm)).fetchall() for arm in arms}

        return await self._read(fetch, snapshot=True)  # both arms from one snapshot

    async def read_engine(self, *, run_id: str, since: Sequence[float]) -> StoredView:
        def aggregate(conn: sqlite3.Connection, arm: Arm, start: float) -> EngineAggregate:
            total = EngineAggregate()
            for query in aggregate_queries(run_id, arm, start, "sqlite"):
                total = total.merge(engine_aggregate_from(conn.execute(*query).fetchone()))
            return total

        def fetch(conn: sqlite3.Connection) -> StoredView:
            arms = _arms(conn, "engine_samples", run_id)
            aggregates = {
                start: {arm: aggregate(conn, arm, start) for arm in arms} for start in since
            }
            plan = restart_plan(run_id, "sqlite")
            try:
                query = next(plan)
                while True:
                    query = plan.send(conn.execute(*query).fetchall())
            except StopIteration as done:
                rows = done.value
            restarts = sorted((_engine_sample(row) for row in rows), key=lambda s: s.t)
            return StoredView(aggregates, restarts)

        return await self._read(fetch, snapshot=True)  # samples and hours written together

    async def read_gpu_samples(
        self, *, run_id: str, since: float | None = None, limit: int | None = None
    ) -> dict[Arm, list[GpuSample]]:
        def fetch(conn: sqlite3.Connection) -> dict[Arm, list[GpuSample]]:
            queries = [
                gpu_sql(run_id, arm, since, limit, "sqlite")
                for arm in _arms(conn, "gpu_samples", run_id)
            ]
            return gpu_by_arm(gpu_sample(row) for q in queries for row in conn.execute(*q))

        return await self._read(fetch)

    async def run_ids(self) -> list[str]:
        def fetch(conn: sqlite3.Connection) -> list[str]:
            return [r for (r,) in conn.execute(RUN_IDS_SQL)]

        return await self._read(fetch)

    async def arm_events(self, *, run_id: str, after_id: int = 0) -> list[ArmEvent]:
        def fetch(conn: sqlite3.Connection) -> list[ArmEvent]:
            rows = conn.execute(armevents.select_sql("sqlite"), (run_id, after_id)).fetchall()
            return [armevents.event_from_row(r) for r in rows]

        return await self._read(fetch)

    async def read_stats_history(
        self, *, run_id: str, since: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        sql, params = stats_history_sql(run_id, since, "sqlite")

        def fetch(conn: sqlite3.Connection) -> list[tuple[float, dict[str, Any]]]:
            return [(t, json.loads(body)) for t, body in conn.execute(sql, params)]

        return await self._read(fetch)

    async def latest_stats(
        self, *, run_id: str, newer_than: float | None = None
    ) -> tuple[float, dict[str, Any]] | None:
        sql, params = latest_stats_sql(run_id, newer_than, "sqlite")

        def fetch(conn: sqlite3.Connection) -> tuple[float, dict[str, Any]] | None:
            row = conn.execute(sql, params).fetchone()
            return (row[0], json.loads(row[1])) if row is not None else None

        return await self._read(fetch)

    async def read_engine_samples(
        self, *, run_id: str, since: float | None = None, arm: Arm | None = None
    ) -> list[EngineSample]:
        sql, params = engine_sql(run_id, since, arm, "sqlite")

        def fetch(conn: sqlite3.Connection) -> list[EngineSample]:
            return [_engine_sample(row) for row in conn.execute(sql, params)]

        return await self._read(fetch)

    async def models(self, *, run_id: str) -> list[str]:
        def fetch(conn: sqlite3.Connection) -> list[str]:
            return [m for (m,) in conn.execute(MODELS_SQL, (run_id,))]

        return await self._read(fetch)

    async def export_chunks(
        self, *, run_id: str | None = None, chunk_rows: int = 10_000
    ) -> AsyncIterator[list[Row]]:
        await self._ensure_open()
        sql, params = export_sql(run_id, "sqlite")
        conn = sqlite3.connect(self.path, timeout=self.timeout_s, check_same_thread=False)
        try:
            cursor = await asyncio.to_thread(conn.execute, sql, params)
            while rows := await asyncio.to_thread(cursor.fetchmany, chunk_rows):
                yield [_typed_export_row(row) for row in rows]
        finally:
            conn.close()


def _read_tiers(
    conn: sqlite3.Connection, *, run_id: str, metric: str, known: TierVersions
) -> TierRead:
    listing = conn.execute(block_list_sql("sqlite"), (run_id, metric)).fetchall()
    changed = changed_blocks(listing, known)
    blobs: dict[BlockKey, bytes] = {}
    if len(changed) > 64:  # a cold reader: one scan instead of a query per block
        wanted = set(changed)
        for st, sp, mo, a, blob in conn.execute(
            block_blobs_sql("sqlite", one=False), (run_id, metric)
        ):
            if (st, sp, mo, a) in wanted:
                blobs[(st, sp, mo, a)] = bytes(blob)
    else:
        for key in changed:
            for st, sp, mo, a, blob in conn.execute(
                block_blobs_sql("sqlite", one=True), (run_id, metric, *key)
            ):
                blobs[(st, sp, mo, a)] = bytes(blob)
    minutes = conn.execute(fine_minutes_sql("sqlite"), (run_id, metric)).fetchall()
    bins: dict[FineKey, tuple[Packed, Packed]] = {}
    for minute in changed_minutes(minutes, known):
        for model, arm, packed_bins, packed_counts in conn.execute(
            fine_bins_of_minute_sql("sqlite"), (run_id, metric, minute)
        ):
            bins[(minute, model, arm)] = (packed_bins, packed_counts)
    return TierRead(listing, blobs, minutes, bins)


_BOOL_INDEXES = tuple(REQUEST_COLUMNS.index(c) for c in ("stream", "shadow", "disconnected"))


def _typed_export_row(row: tuple[Any, ...]) -> tuple[Any, ...]:
    values = list(row)
    for i in _BOOL_INDEXES:
        values[i] = bool(values[i])
    return tuple(values)


# SQLite's bound on a statement's parameters (SQLITE_MAX_VARIABLE_NUMBER, 32766 since 3.32; the
# floor keeps to the pre-3.32 999 anyway) and the rows one statement carries at most.
_MAX_PARAMS: Final = 999
_MAX_ROWS: Final = 256


@functools.lru_cache(maxsize=64)
def _multi_row(sql: str, n: int) -> str:
    """`sql`, one `INSERT ... VALUES (?, ..., 1) ...` of one row (marks and 0/1 literals),
    rewritten for `n` rows."""
    head, _, tail = sql.partition("VALUES (")
    one, _, rest = tail.partition(")")
    if not one or set(one) - set("?, 01"):
        raise ValueError(f"not a one-row INSERT of ? marks: {sql[:80]!r}")
    return f"{head}VALUES {', '.join([f'({one})'] * n)}{rest}"


def insert_rows(conn: sqlite3.Connection, sql: str, rows: Sequence[Sequence[Any]]) -> None:
    """`conn.executemany(sql, rows)` in statements of many rows each: the same rows written in
    the same order, but the GIL is given up and taken back once per statement rather than once
    per row (the sqlite3 module releases it around every step), which on a proxy's one busy core
    is a thread switch to the event loop and back each time."""
    if not rows:
        return
    per = max(1, min(_MAX_ROWS, _MAX_PARAMS // len(rows[0])))
    full = len(rows) - len(rows) % per
    if full:
        stmt = _multi_row(sql, per)
        conn.executemany(
            stmt, [[v for row in rows[i : i + per] for v in row] for i in range(0, full, per)]
        )
    if full < len(rows):
        tail = rows[full:]
        conn.execute(_multi_row(sql, len(tail)), [v for row in tail for v in row])


def _insert_requests(
    conn: sqlite3.Connection, requests: list[RequestRecord]
) -> list[RequestRecord]:
    """Insert rows, ignoring duplicates; return the records that were actually new (so a batch
    replayed from the spill file is not rolled up twice)."""
    rows = [request_row(r) for r in requests]
    before = conn.total_changes
    conn.execute("SAVEPOINT requests_batch")
    insert_rows(conn, _INSERT_REQUEST, rows)
    if conn.total_changes - before == len(rows):
        conn.execute("RELEASE requests_batch")
        return requests
    conn.execute("ROLLBACK TO requests_batch")
    conn.execute("RELEASE requests_batch")
    return [
        r
        for r, row in zip(requests, rows, strict=True)
        if conn.execute(_INSERT_REQUEST, row).rowcount == 1
    ]


def _arms(conn: sqlite3.Connection, table: str, run_id: str) -> list[Arm]:
    """The arms of a run in `table` (`queries.arms_sql`)."""
    return [row[0] for row in conn.execute(*arms_sql(table, run_id, "sqlite"))]
