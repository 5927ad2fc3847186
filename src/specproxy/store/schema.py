"""Versioned schema of the request store and the migrations that bring an old store up to date.

Migrations are frozen in time: each one is the SQL that took the schema from version N-1 to N,
written out by hand, never derived from today's dataclasses, so that a store created by an old
release upgrades the same way whatever the code looks like now. Both dialects move in lock-step:
version N means the same tables and columns in SQLite and PostgreSQL.

Column types: SQLite stores booleans as 0/1 and lists/JSON as text; PostgreSQL uses BOOLEAN,
DOUBLE PRECISION[] and JSONB.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from specproxy.errors import StoreError
from specproxy.records import Arm, EngineSample, GpuSample, RequestRecord
from specproxy.store.enginehours import V7_POSTGRESQL, V7_SQLITE
from specproxy.store.moments import V8_POSTGRESQL, V8_SQLITE

__all__ = [
    "ENGINE_COLUMNS",
    "GPU_COLUMNS",
    "MIGRATIONS",
    "REQUEST_COLUMNS",
    "SCHEMA_VERSION",
    "Dialect",
    "Migration",
    "engine_row",
    "gpu_by_arm",
    "gpu_row",
    "gpu_sample",
    "migrations_after",
    "request_row",
]

Dialect = Literal["sqlite", "postgresql"]


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    sqlite: tuple[str, ...]
    postgresql: tuple[str, ...]

    def statements(self, dialect: Dialect) -> tuple[str, ...]:
        return self.sqlite if dialect == "sqlite" else self.postgresql


# Version 1: the first schema, before per-request acceptance, client disconnects and the
# stats history existed.
_V1_SQLITE = (
    """CREATE TABLE IF NOT EXISTS schema_version (
        version INTEGER PRIMARY KEY,
        applied_at REAL NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS requests (
        request_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        arm TEXT NOT NULL,
        t_start REAL NOT NULL,
        model TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        stream INTEGER NOT NULL,
        status INTEGER NOT NULL,
        e2e_s REAL NOT NULL,
        upstream_s REAL NOT NULL,
        ttft_s REAL,
        tpot_s REAL,
        prompt_tokens INTEGER,
        output_tokens INTEGER,
        n_events INTEGER NOT NULL DEFAULT 0,
        tokens_per_event REAL,
        mean_gap_s REAL,
        max_gap_s REAL,
        pair_id TEXT,
        shadow INTEGER NOT NULL DEFAULT 0,
        error_kind TEXT,
        PRIMARY KEY (run_id, request_id, arm, shadow)
    )""",
    "CREATE INDEX IF NOT EXISTS requests_run_arm_t ON requests (run_id, arm, t_start)",
    """CREATE TABLE IF NOT EXISTS engine_samples (
        t REAL NOT NULL,
        run_id TEXT NOT NULL,
        arm TEXT NOT NULL,
        up INTEGER NOT NULL,
        restarted INTEGER NOT NULL DEFAULT 0,
        acceptance_rate REAL,
        mean_acceptance_length REAL,
        requests_running REAL,
        requests_waiting REAL,
        kv_cache_usage REAL,
        generation_tokens_per_s REAL,
        PRIMARY KEY (run_id, arm, t)
    )""",
)
_V1_POSTGRESQL = (
    """CREATE TABLE IF NOT EXISTS schema_version (
        version INTEGER PRIMARY KEY,
        applied_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS requests (
        request_id TEXT NOT NULL,
        run_id TEXT NOT NULL,
        arm TEXT NOT NULL,
        t_start DOUBLE PRECISION NOT NULL,
        model TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        stream BOOLEAN NOT NULL,
        status INTEGER NOT NULL,
        e2e_s DOUBLE PRECISION NOT NULL,
        upstream_s DOUBLE PRECISION NOT NULL,
        ttft_s DOUBLE PRECISION,
        tpot_s DOUBLE PRECISION,
        prompt_tokens BIGINT,
        output_tokens BIGINT,
        n_events BIGINT NOT NULL DEFAULT 0,
        tokens_per_event DOUBLE PRECISION,
        mean_gap_s DOUBLE PRECISION,
        max_gap_s DOUBLE PRECISION,
        pair_id TEXT,
        shadow BOOLEAN NOT NULL DEFAULT FALSE,
        error_kind TEXT,
        PRIMARY KEY (run_id, request_id, arm, shadow)
    )""",
    "CREATE INDEX IF NOT EXISTS requests_run_arm_t ON requests (run_id, arm, t_start)",
    """CREATE TABLE IF NOT EXISTS engine_samples (
        t DOUBLE PRECISION NOT NULL,
        run_id TEXT NOT NULL,
        arm TEXT NOT NULL,
        up BOOLEAN NOT NULL,
        restarted BOOLEAN NOT NULL DEFAULT FALSE,
        acceptance_rate DOUBLE PRECISION,
        mean_acceptance_length DOUBLE PRECISION,
        requests_running DOUBLE PRECISION,
        requests_waiting DOUBLE PRECISION,
        kv_cache_usage DOUBLE PRECISION,
        generation_tokens_per_s DOUBLE PRECISION,
        PRIMARY KEY (run_id, arm, t)
    )""",
)

# Version 2: per-request acceptance (vLLM's response metrics), client disconnects, per-position
# acceptance and process start time of engines, the stats history, and a time index for retention.
_V2_SQLITE = (
    "ALTER TABLE requests ADD COLUMN acceptance_rate REAL",
    "ALTER TABLE requests ADD COLUMN mean_acceptance_length REAL",
    "ALTER TABLE requests ADD COLUMN disconnected INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE engine_samples ADD COLUMN position_acceptance TEXT",
    "ALTER TABLE engine_samples ADD COLUMN process_start_time REAL",
    "CREATE INDEX IF NOT EXISTS requests_t ON requests (t_start)",
    "CREATE INDEX IF NOT EXISTS engine_samples_t ON engine_samples (t)",
    """CREATE TABLE IF NOT EXISTS stats_history (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        t REAL NOT NULL,
        result TEXT NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS stats_history_run_t ON stats_history (run_id, t)",
)
_V2_POSTGRESQL = (
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS acceptance_rate DOUBLE PRECISION",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS mean_acceptance_length DOUBLE PRECISION",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS disconnected BOOLEAN NOT NULL DEFAULT FALSE",
    "ALTER TABLE engine_samples ADD COLUMN IF NOT EXISTS position_acceptance DOUBLE PRECISION[]",
    "ALTER TABLE engine_samples ADD COLUMN IF NOT EXISTS process_start_time DOUBLE PRECISION",
    "CREATE INDEX IF NOT EXISTS requests_t ON requests (t_start)",
    "CREATE INDEX IF NOT EXISTS engine_samples_t ON engine_samples (t)",
    """CREATE TABLE IF NOT EXISTS stats_history (
        id BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL,
        t DOUBLE PRECISION NOT NULL,
        result JSONB NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS stats_history_run_t ON stats_history (run_id, t)",
)

# Version 3: an arm is a pool of engine endpoints; each request names the one that served it.
_V3_SQLITE = ("ALTER TABLE requests ADD COLUMN engine_url TEXT",)
_V3_POSTGRESQL = ("ALTER TABLE requests ADD COLUMN IF NOT EXISTS engine_url TEXT",)

# Version 4: per-minute additive rollups (issue 14): a summary and a fixed-grid histogram per
# (run, minute, model, arm, metric); the stats job reads these instead of rows for big windows.
_V4_SQLITE = (
    """CREATE TABLE IF NOT EXISTS rollup_minutes (
        run_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        minute INTEGER NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n INTEGER NOT NULL,
        total REAL NOT NULL,
        total_sq REAL NOT NULL,
        PRIMARY KEY (run_id, metric, minute, model, arm)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS rollup_bins (
        run_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        minute INTEGER NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        bin INTEGER NOT NULL,
        count INTEGER NOT NULL,
        PRIMARY KEY (run_id, metric, minute, model, arm, bin)
    ) WITHOUT ROWID""",
)
_V4_POSTGRESQL = (
    """CREATE TABLE IF NOT EXISTS rollup_minutes (
        run_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        minute BIGINT NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n BIGINT NOT NULL,
        total DOUBLE PRECISION NOT NULL,
        total_sq DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_id, metric, minute, model, arm)
    )""",
    """CREATE TABLE IF NOT EXISTS rollup_bins (
        run_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        minute BIGINT NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        bin INTEGER NOT NULL,
        count BIGINT NOT NULL,
        PRIMARY KEY (run_id, metric, minute, model, arm, bin)
    )""",
)

# Version 5: the compacted rollup tier (issue 14, scale): one row per block of minutes of a
# (run, metric, model, arm) holding exact per-minute sums and one coarse histogram as a blob
# (`specproxy.summary.blocks`); the stats leader moves closed fine rows here (`store.compaction`).
_V5_SQLITE = (
    """CREATE TABLE IF NOT EXISTS rollup_blocks (
        run_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        start INTEGER NOT NULL,
        span INTEGER NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n INTEGER NOT NULL,
        blob BLOB NOT NULL,
        PRIMARY KEY (run_id, metric, start, span, model, arm)
    ) WITHOUT ROWID""",
)
_V5_POSTGRESQL = (
    """CREATE TABLE IF NOT EXISTS rollup_blocks (
        run_id TEXT NOT NULL,
        metric TEXT NOT NULL,
        start BIGINT NOT NULL,
        span INTEGER NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n BIGINT NOT NULL,
        blob BYTEA NOT NULL,
        PRIMARY KEY (run_id, metric, start, span, model, arm)
    )""",
)

# Version 6: the GPU telemetry of the arms (issue 14, `records.GpuSample`): one row per arm and
# dcgm-exporter scrape, so `specproxy stats`, the report and a new stats leader see it. Additive.
# Clock-event reasons are comma-joined names (a fixed set, `scrape.dcgm.CLOCK_REASON_BITS`; ""
# when none is active, NULL when not exported) in both dialects; `error` is bounded by the record.
_V6_SQLITE = (
    """CREATE TABLE IF NOT EXISTS gpu_samples (
        t REAL NOT NULL,
        run_id TEXT NOT NULL,
        arm TEXT NOT NULL,
        up INTEGER NOT NULL,
        gpus INTEGER NOT NULL DEFAULT 0,
        utilization REAL,
        memory_bandwidth REAL,
        bandwidth_source TEXT,
        sm_clock_mhz REAL,
        temperature_c REAL,
        clock_reasons TEXT,
        thermal_throttled INTEGER,
        error TEXT,
        PRIMARY KEY (run_id, arm, t)
    )""",
    "CREATE INDEX IF NOT EXISTS gpu_samples_t ON gpu_samples (t)",
)
_V6_POSTGRESQL = (
    """CREATE TABLE IF NOT EXISTS gpu_samples (
        t DOUBLE PRECISION NOT NULL,
        run_id TEXT NOT NULL,
        arm TEXT NOT NULL,
        up BOOLEAN NOT NULL,
        gpus INTEGER NOT NULL DEFAULT 0,
        utilization DOUBLE PRECISION,
        memory_bandwidth DOUBLE PRECISION,
        bandwidth_source TEXT,
        sm_clock_mhz DOUBLE PRECISION,
        temperature_c DOUBLE PRECISION,
        clock_reasons TEXT,
        thermal_throttled BOOLEAN,
        error TEXT,
        PRIMARY KEY (run_id, arm, t)
    )""",
    "CREATE INDEX IF NOT EXISTS gpu_samples_t ON gpu_samples (t)",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "requests and engine samples", _V1_SQLITE, _V1_POSTGRESQL),
    Migration(2, "acceptance, disconnects, stats history", _V2_SQLITE, _V2_POSTGRESQL),
    Migration(3, "engine endpoint of each request", _V3_SQLITE, _V3_POSTGRESQL),
    Migration(4, "per-minute additive rollups", _V4_SQLITE, _V4_POSTGRESQL),
    Migration(5, "compacted rollup blocks", _V5_SQLITE, _V5_POSTGRESQL),
    Migration(6, "GPU samples", _V6_SQLITE, _V6_POSTGRESQL),
    # Version 7: hourly engine-sample aggregates (filled from the stored samples) and an index
    # of restarts, so a stats tick never reads every engine sample (`store.enginehours`).
    Migration(7, "hourly engine aggregates", V7_SQLITE, V7_POSTGRESQL),
    # Version 8: the length adjustment's sufficient statistics per minute and per hour, so a
    # window analysed from rollups has the adjusted speedup too (`store.moments`).
    Migration(8, "rollup moments of the length adjustment", V8_SQLITE, V8_POSTGRESQL),
)
SCHEMA_VERSION = MIGRATIONS[-1].version


def migrations_after(found: int) -> list[Migration]:
    """The migrations a store at schema version `found` still needs, in order; a store newer than
    this code is a `StoreError` (it would be written with columns we do not know)."""
    if found > SCHEMA_VERSION:
        raise StoreError(
            f"store schema version {found} is newer than this specproxy ({SCHEMA_VERSION})"
        )
    return [m for m in MIGRATIONS if m.version > found]


# Columns of the current schema, in RequestRecord / EngineSample field order.
REQUEST_COLUMNS: tuple[str, ...] = (
    "request_id",
    "run_id",
    "arm",
    "t_start",
    "model",
    "endpoint",
    "stream",
    "status",
    "e2e_s",
    "upstream_s",
    "ttft_s",
    "tpot_s",
    "prompt_tokens",
    "output_tokens",
    "n_events",
    "tokens_per_event",
    "mean_gap_s",
    "max_gap_s",
    "acceptance_rate",
    "mean_acceptance_length",
    "pair_id",
    "shadow",
    "error_kind",
    "disconnected",
    "engine_url",
)
ENGINE_COLUMNS: tuple[str, ...] = (
    "t",
    "run_id",
    "arm",
    "up",
    "restarted",
    "acceptance_rate",
    "mean_acceptance_length",
    "position_acceptance",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "generation_tokens_per_s",
    "process_start_time",
)

GPU_COLUMNS: tuple[str, ...] = (
    "t",
    "run_id",
    "arm",
    "up",
    "gpus",
    "utilization",
    "memory_bandwidth",
    "bandwidth_source",
    "sm_clock_mhz",
    "temperature_c",
    "clock_reasons",
    "thermal_throttled",
    "error",
)


def request_row(rec: RequestRecord) -> tuple[Any, ...]:
    """A record as a row in `REQUEST_COLUMNS` order (both dialects take the same values)."""
    return (
        rec.request_id,
        rec.run_id,
        rec.arm.value,
        rec.t_start,
        rec.model,
        rec.endpoint,
        rec.stream,
        rec.status,
        rec.e2e_s,
        rec.upstream_s,
        rec.ttft_s,
        rec.tpot_s,
        rec.prompt_tokens,
        rec.output_tokens,
        rec.n_events,
        rec.tokens_per_event,
        rec.mean_gap_s,
        rec.max_gap_s,
        rec.acceptance_rate,
        rec.mean_acceptance_length,
        rec.pair_id,
        rec.shadow,
        rec.error_kind.value if rec.error_kind is not None else None,
        rec.disconnected,
        rec.engine_url,
    )


def engine_row(s: EngineSample, dialect: Dialect) -> tuple[Any, ...]:
    """A sample as a row in `ENGINE_COLUMNS` order; positions are JSON text in SQLite, an array
    in PostgreSQL."""
    positions: Any = None
    if s.position_acceptance is not None:
        positions = list(s.position_acceptance)
        if dialect == "sqlite":
            positions = json.dumps(positions)
    return (
        s.t,
        s.run_id,
        s.arm.value,
        s.up,
        s.restarted,
        s.acceptance_rate,
        s.mean_acceptance_length,
        positions,
        s.requests_running,
        s.requests_waiting,
        s.kv_cache_usage,
        s.generation_tokens_per_s,
        s.process_start_time,
    )


def gpu_row(s: GpuSample) -> tuple[Any, ...]:
    """A GPU sample as a row in `GPU_COLUMNS` order (both dialects take the same values)."""
    return (
        s.t,
        s.run_id,
        s.arm.value,
        s.up,
        s.gpus,
        s.utilization,
        s.memory_bandwidth,
        s.bandwidth_source,
        s.sm_clock_mhz,
        s.temperature_c,
        ",".join(s.clock_reasons) if s.clock_reasons is not None else None,
        s.thermal_throttled,
        s.error,
    )


_ARMS = {arm.value: arm for arm in Arm}


def gpu_sample(row: Sequence[Any]) -> GpuSample:
    """A row in `GPU_COLUMNS` order, from either dialect, as the sample `gpu_row` stored (a
    plain unpacking: a read may decode tens of thousands of rows per stats tick)."""
    t, run_id, arm, up, gpus, util, bandwidth, source, clock, temp, reasons, throttled, error = row
    return GpuSample(
        t=t,
        arm=_ARMS[arm],
        up=bool(up),
        run_id=run_id,
        gpus=gpus,
        utilization=util,
        memory_bandwidth=bandwidth,
        bandwidth_source=source,
        sm_clock_mhz=clock,
        temperature_c=temp,
        clock_reasons=None if reasons is None else tuple(n for n in reasons.split(",") if n),
        thermal_throttled=None if throttled is None else bool(throttled),
        error=error,
    )


def gpu_by_arm(
    samples: Iterable[GpuSample], limit: int | None = None
) -> dict[Arm, list[GpuSample]]:
    """`read_gpu_samples`' answer: per arm the newest `limit` samples (all when None) in time
    order, only arms that have any (an arm without exporters has none, so the diagnosis does
    not evaluate its GPU branches)."""
    out: dict[Arm, list[GpuSample]] = {}
    for sample in sorted(samples, key=lambda g: g.t):
        out.setdefault(sample.arm, []).append(sample)
    if limit is not None:
        out = {arm: kept[-limit:] for arm, kept in out.items() if limit > 0}
    return out
