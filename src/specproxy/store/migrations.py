"""Every migration of the store's schema, frozen: the SQL that took version N-1 to N, both dialects.

Each is written out by hand (never derived from today's code), so a store created by an old
release upgrades the same way whatever the code looks like now. Both dialects move in lock-step:
version N means the same tables and columns in SQLite and PostgreSQL. A new version is appended
here as literal SQL (`aggregates.create_table_sql` prints the DDL of a new aggregate) with an
upgrade test from the previous version on both dialects (tests/store/test_schema.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from specproxy.errors import StoreError
from specproxy.store.schema import Dialect

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "Migration", "migrations_after"]


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
# dcgm-exporter scrape, so the stats command, the report and a new stats leader see it. Additive.
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

# Version 7: hourly engine-sample aggregates (`engine_hours`, backfilled from the stored samples)
# and an index of restarts, so a stats tick never reads every engine sample.
_V7_SQLITE = (
    (
        "CREATE TABLE IF NOT EXISTS engine_hours (\n"
        "        run_id TEXT NOT NULL,\n"
        "        arm TEXT NOT NULL,\n"
        "        hour INTEGER NOT NULL,\n"
        "        n INTEGER NOT NULL, restarts INTEGER NOT NULL, up_samples INTEGER NOT NULL, "
        "sum_acceptance_rate REAL NOT NULL, n_acceptance_rate INTEGER NOT NULL, "
        "sum_mean_acceptance_length REAL NOT NULL, n_mean_acceptance_length INTEGER NOT NULL, "
        "sum_requests_running REAL NOT NULL, n_requests_running INTEGER NOT NULL, "
        "sum_kv_cache_usage REAL NOT NULL, n_kv_cache_usage INTEGER NOT NULL,\n"
        "        max_k INTEGER,\n"
        "        PRIMARY KEY (run_id, arm, hour)\n"
        "    )"
    ),
    (
        "INSERT INTO engine_hours (run_id, arm, hour, n, restarts, up_samples, "
        "sum_acceptance_rate, n_acceptance_rate, sum_mean_acceptance_length, "
        "n_mean_acceptance_length, sum_requests_running, n_requests_running, sum_kv_cache_usage, "
        "n_kv_cache_usage, max_k) SELECT run_id, arm, h, COUNT(*), COUNT(CASE WHEN restarted "
        "THEN 1 END), COUNT(CASE WHEN up THEN 1 END), COALESCE(SUM(CASE WHEN up AND "
        "acceptance_rate > -9e999 AND acceptance_rate < 9e999 THEN acceptance_rate END), 0), "
        "COUNT(CASE WHEN up AND acceptance_rate > -9e999 AND acceptance_rate < 9e999 THEN 1 "
        "END), COALESCE(SUM(CASE WHEN up AND mean_acceptance_length > -9e999 AND "
        "mean_acceptance_length < 9e999 THEN mean_acceptance_length END), 0), COUNT(CASE WHEN up "
        "AND mean_acceptance_length > -9e999 AND mean_acceptance_length < 9e999 THEN 1 END), "
        "COALESCE(SUM(CASE WHEN up AND requests_running > -9e999 AND requests_running < 9e999 "
        "THEN requests_running END), 0), COUNT(CASE WHEN up AND requests_running > -9e999 AND "
        "requests_running < 9e999 THEN 1 END), COALESCE(SUM(CASE WHEN up AND kv_cache_usage > "
        "-9e999 AND kv_cache_usage < 9e999 THEN kv_cache_usage END), 0), COUNT(CASE WHEN up AND "
        "kv_cache_usage > -9e999 AND kv_cache_usage < 9e999 THEN 1 END), MAX(CASE WHEN up THEN "
        "CASE WHEN position_acceptance IS NULL OR position_acceptance = '[]' THEN NULL ELSE "
        "length(position_acceptance) - length(replace(position_acceptance, ',', '')) + 1 END "
        "END) FROM (SELECT *, (CASE WHEN t < (CASE WHEN t / 3600 < CAST(t / 3600 AS INTEGER) "
        "THEN CAST(t / 3600 AS INTEGER) - 1 ELSE CAST(t / 3600 AS INTEGER) END) * 3600 THEN "
        "(CASE WHEN t / 3600 < CAST(t / 3600 AS INTEGER) THEN CAST(t / 3600 AS INTEGER) - 1 ELSE "
        "CAST(t / 3600 AS INTEGER) END) - 1 WHEN t >= ((CASE WHEN t / 3600 < CAST(t / 3600 AS "
        "INTEGER) THEN CAST(t / 3600 AS INTEGER) - 1 ELSE CAST(t / 3600 AS INTEGER) END) + 1) * "
        "3600 THEN (CASE WHEN t / 3600 < CAST(t / 3600 AS INTEGER) THEN CAST(t / 3600 AS "
        "INTEGER) - 1 ELSE CAST(t / 3600 AS INTEGER) END) + 1 ELSE (CASE WHEN t / 3600 < CAST(t "
        "/ 3600 AS INTEGER) THEN CAST(t / 3600 AS INTEGER) - 1 ELSE CAST(t / 3600 AS INTEGER) "
        "END) END) AS h FROM engine_samples WHERE 1) AS s GROUP BY run_id, arm, h"
    ),
    (
        "CREATE INDEX IF NOT EXISTS engine_samples_restarts ON engine_samples (run_id, arm, t) "
        "WHERE restarted"
    ),
)

_V7_POSTGRESQL = (
    (
        "CREATE TABLE IF NOT EXISTS engine_hours (\n"
        "        run_id TEXT NOT NULL,\n"
        "        arm TEXT NOT NULL,\n"
        "        hour BIGINT NOT NULL,\n"
        "        n BIGINT NOT NULL, restarts BIGINT NOT NULL, up_samples BIGINT NOT NULL, "
        "sum_acceptance_rate DOUBLE PRECISION NOT NULL, n_acceptance_rate BIGINT NOT NULL, "
        "sum_mean_acceptance_length DOUBLE PRECISION NOT NULL, n_mean_acceptance_length BIGINT "
        "NOT NULL, sum_requests_running DOUBLE PRECISION NOT NULL, n_requests_running BIGINT NOT "
        "NULL, sum_kv_cache_usage DOUBLE PRECISION NOT NULL, n_kv_cache_usage BIGINT NOT NULL,\n"
        "        max_k BIGINT,\n"
        "        PRIMARY KEY (run_id, arm, hour)\n"
        "    )"
    ),
    (
        "INSERT INTO engine_hours (run_id, arm, hour, n, restarts, up_samples, "
        "sum_acceptance_rate, n_acceptance_rate, sum_mean_acceptance_length, "
        "n_mean_acceptance_length, sum_requests_running, n_requests_running, sum_kv_cache_usage, "
        "n_kv_cache_usage, max_k) SELECT run_id, arm, h, COUNT(*), COUNT(CASE WHEN restarted "
        "THEN 1 END), COUNT(CASE WHEN up THEN 1 END), COALESCE(SUM(CASE WHEN up AND "
        "acceptance_rate > -'Infinity'::float8 AND acceptance_rate < 'Infinity'::float8 THEN "
        "acceptance_rate END), 0), COUNT(CASE WHEN up AND acceptance_rate > -'Infinity'::float8 "
        "AND acceptance_rate < 'Infinity'::float8 THEN 1 END), COALESCE(SUM(CASE WHEN up AND "
        "mean_acceptance_length > -'Infinity'::float8 AND mean_acceptance_length < "
        "'Infinity'::float8 THEN mean_acceptance_length END), 0), COUNT(CASE WHEN up AND "
        "mean_acceptance_length > -'Infinity'::float8 AND mean_acceptance_length < "
        "'Infinity'::float8 THEN 1 END), COALESCE(SUM(CASE WHEN up AND requests_running > "
        "-'Infinity'::float8 AND requests_running < 'Infinity'::float8 THEN requests_running "
        "END), 0), COUNT(CASE WHEN up AND requests_running > -'Infinity'::float8 AND "
        "requests_running < 'Infinity'::float8 THEN 1 END), COALESCE(SUM(CASE WHEN up AND "
        "kv_cache_usage > -'Infinity'::float8 AND kv_cache_usage < 'Infinity'::float8 THEN "
        "kv_cache_usage END), 0), COUNT(CASE WHEN up AND kv_cache_usage > -'Infinity'::float8 "
        "AND kv_cache_usage < 'Infinity'::float8 THEN 1 END), MAX(CASE WHEN up THEN "
        "NULLIF(cardinality(position_acceptance), 0) END) FROM (SELECT *, (CASE WHEN t < "
        "CAST(floor(t / 3600) AS BIGINT) * 3600 THEN CAST(floor(t / 3600) AS BIGINT) - 1 WHEN t "
        ">= (CAST(floor(t / 3600) AS BIGINT) + 1) * 3600 THEN CAST(floor(t / 3600) AS BIGINT) + "
        "1 ELSE CAST(floor(t / 3600) AS BIGINT) END) AS h FROM engine_samples WHERE TRUE) AS s "
        "GROUP BY run_id, arm, h"
    ),
    (
        "CREATE INDEX IF NOT EXISTS engine_samples_restarts ON engine_samples (run_id, arm, t) "
        "WHERE restarted"
    ),
)

# Version 8: the length adjustment's sufficient statistics per minute and per hour, so a window
# analysed from rollups has the adjusted speedup too (`rollup_moments`, `rollup_moment_hours`).
_V8_SQLITE = (
    """CREATE TABLE IF NOT EXISTS rollup_moments (
        run_id TEXT NOT NULL,
        minute INTEGER NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n INTEGER NOT NULL,
        su REAL NOT NULL,
        sv REAL NOT NULL,
        suu REAL NOT NULL,
        svv REAL NOT NULL,
        suv REAL NOT NULL,
        sy REAL NOT NULL,
        suy REAL NOT NULL,
        svy REAL NOT NULL,
        syy REAL NOT NULL,
        PRIMARY KEY (run_id, minute, model, arm)
    ) WITHOUT ROWID""",
    """CREATE TABLE IF NOT EXISTS rollup_moment_hours (
        run_id TEXT NOT NULL,
        start INTEGER NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n INTEGER NOT NULL,
        su REAL NOT NULL,
        sv REAL NOT NULL,
        suu REAL NOT NULL,
        svv REAL NOT NULL,
        suv REAL NOT NULL,
        sy REAL NOT NULL,
        suy REAL NOT NULL,
        svy REAL NOT NULL,
        syy REAL NOT NULL,
        PRIMARY KEY (run_id, start, model, arm)
    ) WITHOUT ROWID""",
)

_V8_POSTGRESQL = (
    """CREATE TABLE IF NOT EXISTS rollup_moments (
        run_id TEXT NOT NULL,
        minute BIGINT NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n BIGINT NOT NULL,
        su DOUBLE PRECISION NOT NULL,
        sv DOUBLE PRECISION NOT NULL,
        suu DOUBLE PRECISION NOT NULL,
        svv DOUBLE PRECISION NOT NULL,
        suv DOUBLE PRECISION NOT NULL,
        sy DOUBLE PRECISION NOT NULL,
        suy DOUBLE PRECISION NOT NULL,
        svy DOUBLE PRECISION NOT NULL,
        syy DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_id, minute, model, arm)
    )""",
    """CREATE TABLE IF NOT EXISTS rollup_moment_hours (
        run_id TEXT NOT NULL,
        start BIGINT NOT NULL,
        model TEXT NOT NULL,
        arm TEXT NOT NULL,
        n BIGINT NOT NULL,
        su DOUBLE PRECISION NOT NULL,
        sv DOUBLE PRECISION NOT NULL,
        suu DOUBLE PRECISION NOT NULL,
        svv DOUBLE PRECISION NOT NULL,
        suv DOUBLE PRECISION NOT NULL,
        sy DOUBLE PRECISION NOT NULL,
        suy DOUBLE PRECISION NOT NULL,
        svy DOUBLE PRECISION NOT NULL,
        syy DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (run_id, start, model, arm)
    )""",
)

# Version 9: the arm-control events (`control.events.ArmEvent`): set a treatment's weight, pause,
# resume, stop or start the experiment; appended by the admin API and the guarded ramp, polled by
# every replica by id. Never purged by retention (a restart folds every event of its run).
_V9_SQLITE = (
    """CREATE TABLE IF NOT EXISTS arm_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id TEXT NOT NULL,
        t REAL NOT NULL,
        action TEXT NOT NULL,
        arm TEXT NOT NULL,
        weight REAL,
        who TEXT NOT NULL,
        why TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX IF NOT EXISTS arm_events_run_id ON arm_events (run_id, id)",
)
_V9_POSTGRESQL = (
    """CREATE TABLE IF NOT EXISTS arm_events (
        id BIGSERIAL PRIMARY KEY,
        run_id TEXT NOT NULL,
        t DOUBLE PRECISION NOT NULL,
        action TEXT NOT NULL,
        arm TEXT NOT NULL,
        weight DOUBLE PRECISION,
        who TEXT NOT NULL,
        why TEXT NOT NULL DEFAULT ''
    )""",
    "CREATE INDEX IF NOT EXISTS arm_events_run_id ON arm_events (run_id, id)",
)


# Version 10: failing open (issue 25): a request routed to a treatment that was down and served
# by the control names the treatment and why; such rows are kept out of every comparison.
_V10_SQLITE = (
    "ALTER TABLE requests ADD COLUMN rerouted_from TEXT",
    "ALTER TABLE requests ADD COLUMN reroute_reason TEXT",
)
_V10_POSTGRESQL = (
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS rerouted_from TEXT",
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS reroute_reason TEXT",
)

# Version 11: each request's conditions (issue 26): the proxy's calls in flight to its arm and
# endpoint, the engine's running and waiting requests at the latest scrape, the body's
# temperature and the client's bounded category.
_V11_COLUMNS = (
    ("arm_in_flight", "INTEGER", "INTEGER"),
    ("endpoint_in_flight", "INTEGER", "INTEGER"),
    ("engine_running", "REAL", "DOUBLE PRECISION"),
    ("engine_waiting", "REAL", "DOUBLE PRECISION"),
    ("temperature", "REAL", "DOUBLE PRECISION"),
    ("category", "TEXT", "TEXT"),
)
_V11_SQLITE = tuple(f"ALTER TABLE requests ADD COLUMN {c} {t}" for c, t, _ in _V11_COLUMNS)
_V11_POSTGRESQL = tuple(
    f"ALTER TABLE requests ADD COLUMN IF NOT EXISTS {c} {t}" for c, _, t in _V11_COLUMNS
)

# Version 12: the requests by their end (t_start + e2e_s), so the guarded ramp reads each tick only
# the requests that ended since its last read (`read_records(ended_since=...)`), however long its
# step has lasted. Building it on an existing store reads the requests table once.
_V12 = (
    "CREATE INDEX IF NOT EXISTS requests_run_arm_end ON requests (run_id, arm, (t_start + e2e_s))",
)

# Version 13: deferred rollups (`store.rollups = "deferred"`, issue 27): a proxy writes its rows
# marked pending and the stats leader folds them into the rollups (`fold_pending`); the partial
# index holds only the pending rows, so finding them costs nothing when there are none. Existing
# rows were rolled up when written: they are not pending.
_V13_SQLITE = (
    "ALTER TABLE requests ADD COLUMN rollup_pending INTEGER NOT NULL DEFAULT 0",
    "CREATE INDEX IF NOT EXISTS requests_rollup_pending ON requests (run_id) "
    "WHERE rollup_pending = 1",
)
_V13_POSTGRESQL = (
    "ALTER TABLE requests ADD COLUMN IF NOT EXISTS rollup_pending BOOLEAN NOT NULL DEFAULT false",
    "CREATE INDEX IF NOT EXISTS requests_rollup_pending ON requests (run_id) WHERE rollup_pending",
)

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "requests and engine samples", _V1_SQLITE, _V1_POSTGRESQL),
    Migration(2, "acceptance, disconnects, stats history", _V2_SQLITE, _V2_POSTGRESQL),
    Migration(3, "engine endpoint of each request", _V3_SQLITE, _V3_POSTGRESQL),
    Migration(4, "per-minute additive rollups", _V4_SQLITE, _V4_POSTGRESQL),
    Migration(5, "compacted rollup blocks", _V5_SQLITE, _V5_POSTGRESQL),
    Migration(6, "GPU samples", _V6_SQLITE, _V6_POSTGRESQL),
    Migration(7, "hourly engine aggregates", _V7_SQLITE, _V7_POSTGRESQL),
    Migration(8, "rollup moments of the length adjustment", _V8_SQLITE, _V8_POSTGRESQL),
    Migration(9, "arm-control events", _V9_SQLITE, _V9_POSTGRESQL),
    Migration(10, "rerouted requests (failing open)", _V10_SQLITE, _V10_POSTGRESQL),
    Migration(11, "request conditions", _V11_SQLITE, _V11_POSTGRESQL),
    Migration(12, "requests by their end", _V12, _V12),
    Migration(13, "deferred rollups", _V13_SQLITE, _V13_POSTGRESQL),
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
