"""The raw tables' columns and the conversions between records and rows, for both dialects.

Column lists are in record field order (`REQUEST_COLUMNS`, `ENGINE_COLUMNS`, `GPU_COLUMNS`); the
row builders give both dialects the same values except where their types differ: SQLite stores
booleans as 0/1 and lists as JSON text, PostgreSQL uses BOOLEAN and DOUBLE PRECISION[]. The
migrations that create these tables are frozen in `migrations`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any, Literal

from specproxy.records import (
    BOOL_COLUMNS,
    TEXT_COLUMNS,
    Arm,
    EngineSample,
    GpuSample,
    RequestRecord,
)

__all__ = [
    "BOOL_COLUMNS",
    "ENGINE_COLUMNS",
    "GPU_COLUMNS",
    "REQUEST_COLUMNS",
    "TEXT_COLUMNS",
    "Dialect",
    "engine_row",
    "gpu_by_arm",
    "gpu_row",
    "gpu_sample",
    "request_record",
    "request_row",
]

Dialect = Literal["sqlite", "postgresql"]


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
    "rerouted_from",
    "reroute_reason",
    "arm_in_flight",
    "endpoint_in_flight",
    "engine_running",
    "engine_waiting",
    "temperature",
    "category",
)
_BOOL_INDEXES = tuple(i for i, c in enumerate(REQUEST_COLUMNS) if c in BOOL_COLUMNS)
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
        rec.arm,
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
        rec.rerouted_from,
        rec.reroute_reason.value if rec.reroute_reason is not None else None,
        rec.arm_in_flight,
        rec.endpoint_in_flight,
        rec.engine_running,
        rec.engine_waiting,
        rec.temperature,
        rec.category,
    )


def request_record(row: Sequence[Any]) -> RequestRecord:
    """A row in `REQUEST_COLUMNS` order, from either dialect, as the record `request_row` stored
    (SQLite's 0/1 booleans made bools again; the record's own checks restore the enums)."""
    values = list(row)
    for i in _BOOL_INDEXES:
        values[i] = bool(values[i])
    return RequestRecord(*values)


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
        s.arm,
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
        s.arm,
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


def gpu_sample(row: Sequence[Any]) -> GpuSample:
    """A row in `GPU_COLUMNS` order, from either dialect, as the sample `gpu_row` stored (a
    plain unpacking: a read may decode tens of thousands of rows per stats tick)."""
    t, run_id, arm, up, gpus, util, bandwidth, source, clock, temp, reasons, throttled, error = row
    return GpuSample(
        t=t,
        arm=arm,
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
