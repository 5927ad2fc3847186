"""NVIDIA dcgm-exporter /metrics text -> per-GPU readings -> one arm's `GpuSample`. Pure.

The optional GPU telemetry of an arm (`[baseline]`/`[speculative]` `dcgm_urls`) feeds two
branches of the diagnosis: memory bandwidth saturated, and thermal throttling. The fields read,
by the names dcgm-exporter exposes (one gauge per field, one series per GPU or MIG instance,
labelled `gpu`, `UUID`, `device`, `modelName`, `Hostname`, and on MIG `GPU_I_PROFILE`/`GPU_I_ID`):

- `DCGM_FI_DEV_GPU_UTIL` (%), `DCGM_FI_DEV_SM_CLOCK` (MHz), `DCGM_FI_DEV_GPU_TEMP` (°C),
  `DCGM_FI_DEV_MEM_COPY_UTIL` (%): in dcgm-exporter's default counters (etc/default-counters.csv);
- `DCGM_FI_PROF_DRAM_ACTIVE` (ratio 0-1 of cycles the memory interface is busy): a profiling
  (DCP) field, in the default counters of current releases; where it is missing,
  `DCGM_FI_DEV_MEM_COPY_UTIL` (the share of time memory was read or written) stands in, coarser;
- the clock-event (throttle) reasons bitmask, DCGM field 112, exposed under the name the exporter's
  DCGM bindings give it: `DCGM_FI_DEV_CLOCK_THROTTLE_REASONS` before DCGM 4.0,
  `DCGM_FI_DEV_CLOCKS_EVENT_REASONS` since (dcgm-exporter commit 09d74b9, "Updates for DCGM
  4.0"). It is NOT in the default counters: add it to the exporter's CSV. The exporter's own
  windowed counts `DCGM_EXP_CLOCK_EVENTS_COUNT{clock_event}` (3.4+; first named
  `DCGM_FI_EXP_CLOCK_THROTTLE_REASONS_COUNT{throttle_reason}`) are read too: a count above 0
  marks the reason active, for as long as the exporter's window (5 min by default) holds it.

The reason bits are NVML's (`nvmlClocksEventReason*`, go-nvml pkg/nvml/nvml.h), copied 1:1 by DCGM
(NVIDIA/DCGM dcgmlib/dcgm_fields.h, `DCGM_CLOCKS_EVENT_REASON_*`); the names are the ones
dcgm-exporter gives them (internal/pkg/collector/clock_events_collector.go). DCGM reports a
missing value as a sentinel at or above `DCGM_FP64_BLANK` = 2^47 (the int64 ones,
0x7ffffffffffffff0 and up, are larger; dcgmlib/dcgm_structs.h): such a value is "not exported",
never a reading. Sources and commits: tests/fixtures/dcgm-exporter/README.md.

Across an arm's GPUs: utilisation and SM clock are averaged, memory bandwidth and temperature
take the busiest/hottest GPU (one saturated GPU bounds the step of a tensor-parallel engine), and
a reason counts when any GPU has it. Per-GPU labels (UUID, host, pod) never leave this module.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from specproxy.errors import ScrapeError
from specproxy.records import THERMAL_CLOCK_REASONS, Arm, GpuSample
from specproxy.scrape.parse import relevant_lines

__all__ = [
    "BLANK",
    "CLOCK_REASON_BITS",
    "DEFAULT_PORT",
    "GpuReading",
    "combine_readings",
    "decode_clock_reasons",
    "metrics_url",
    "parse_dcgm",
]

DEFAULT_PORT = 9400  # dcgm-exporter's default listen address is :9400

GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"  # percent
MEM_COPY_UTIL = "DCGM_FI_DEV_MEM_COPY_UTIL"  # percent
DRAM_ACTIVE = "DCGM_FI_PROF_DRAM_ACTIVE"  # ratio
SM_CLOCK = "DCGM_FI_DEV_SM_CLOCK"  # MHz
GPU_TEMP = "DCGM_FI_DEV_GPU_TEMP"  # degrees C
CLOCK_REASONS = ("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
# exporter-computed counts of each reason within its window, and the label naming the reason
CLOCK_EVENT_COUNTS = {
    "DCGM_EXP_CLOCK_EVENTS_COUNT": "clock_event",
    "DCGM_FI_EXP_CLOCK_THROTTLE_REASONS_COUNT": "throttle_reason",
}
_READ = frozenset(
    {GPU_UTIL, MEM_COPY_UTIL, DRAM_ACTIVE, SM_CLOCK, GPU_TEMP, *CLOCK_REASONS, *CLOCK_EVENT_COUNTS}
)

# DCGM_CLOCKS_EVENT_REASON_* (= nvmlClocksEventReason*), by dcgm-exporter's label names.
CLOCK_REASON_BITS: dict[str, int] = {
    "gpu_idle": 0x1,
    "clocks_setting": 0x2,
    "power_cap": 0x4,  # SW power cap
    "hw_slowdown": 0x8,  # HW slowdown: temperature too high, power brake, or power too high
    "sync_boost": 0x10,
    "sw_thermal": 0x20,  # SW thermal slowdown
    "hw_thermal": 0x40,  # HW thermal slowdown
    "hw_power_brake": 0x80,
    "display_clocks": 0x100,
}
BLANK = 2.0**47  # DCGM_FP64_BLANK: every DCGM "blank / not found / not supported" is >= this


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU (or MIG instance) in one exporter scrape; None: not exported (or DCGM blank)."""

    key: str  # UUID (or gpu index), plus "/GPU_I_ID" for a MIG instance
    utilization: float | None = None  # 0..1
    dram_active: float | None = None  # 0..1
    mem_copy_util: float | None = None  # 0..1
    sm_clock_mhz: float | None = None
    temperature_c: float | None = None
    clock_reasons: frozenset[str] | None = None  # None: no reasons field for this GPU


def metrics_url(base: str) -> str:
    """The exporter's metrics URL: `base` + "/metrics", unless `base` already ends in it."""
    base = base.rstrip("/")
    return base if base.endswith("/metrics") else base + "/metrics"


def decode_clock_reasons(mask: int) -> frozenset[str]:
    """The reason names whose bits are set in a DCGM clock-event reasons bitmask."""
    return frozenset(name for name, bit in CLOCK_REASON_BITS.items() if mask & bit)


def _value(raw: float) -> float | None:
    """The reading, or None for a DCGM blank: one threshold for every field, since no field read
    here (percent, ratio, MHz, °C, a 9-bit mask) comes near 2^47 as a real value."""
    value = float(raw)
    return value if math.isfinite(value) and abs(value) < BLANK else None


def parse_dcgm(
    text: str, *, gpus: Collection[str] = (), pods: Sequence[str] = ()
) -> tuple[GpuReading, ...]:
    """Every GPU of one dcgm-exporter page; with `gpus`, only those whose `gpu` or `UUID` label
    is in it; with `pods`, only those whose `pod` label (set by the exporter on Kubernetes for a
    GPU allocated to a pod) starts with one of these prefixes. Raises `ScrapeError` when the text
    is not Prometheus exposition or holds no `DCGM_` sample at all (an HTML page, another
    service); a DCGM page without any field read here gives GPUs with every value None, or none."""
    if "DCGM_" not in text:
        raise ScrapeError("no DCGM fields in the response (is this a dcgm-exporter?)")
    fields: dict[str, dict[str, float | None]] = {}
    reasons: dict[str, set[str]] = {}
    try:
        for family in text_string_to_metric_families(relevant_lines(text, _READ)):
            for sample in family.samples:
                labels = sample.labels
                if gpus and labels.get("gpu") not in gpus and labels.get("UUID") not in gpus:
                    continue
                if pods and not labels.get("pod", "").startswith(tuple(pods)):
                    continue
                key = labels.get("UUID") or labels.get("gpu") or "?"
                if labels.get("GPU_I_ID"):
                    key += "/" + labels["GPU_I_ID"]
                value = _value(sample.value)
                per_gpu = fields.setdefault(key, {})
                if sample.name in CLOCK_REASONS:
                    found = reasons.setdefault(key, set())
                    if value is not None and value >= 0:
                        found |= decode_clock_reasons(int(value))
                elif sample.name in CLOCK_EVENT_COUNTS:
                    found = reasons.setdefault(key, set())
                    reason = labels.get(CLOCK_EVENT_COUNTS[sample.name], "")
                    if value and reason in CLOCK_REASON_BITS:
                        found.add(reason)
                else:
                    per_gpu[sample.name] = value
    except ValueError as exc:  # the parser's only error type for malformed text
        raise ScrapeError(f"not Prometheus text: {exc}") from exc

    def percent(value: float | None) -> float | None:
        return value / 100.0 if value is not None else None

    return tuple(
        GpuReading(
            key=key,
            utilization=percent(values.get(GPU_UTIL)),
            dram_active=values.get(DRAM_ACTIVE),
            mem_copy_util=percent(values.get(MEM_COPY_UTIL)),
            sm_clock_mhz=values.get(SM_CLOCK),
            temperature_c=values.get(GPU_TEMP),
            clock_reasons=frozenset(reasons[key]) if key in reasons else None,
        )
        for key, values in sorted(fields.items())
    )


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return math.fsum(kept) / len(kept) if kept else None


def _max(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return max(kept) if kept else None


def combine_readings(
    t: float,
    arm: Arm,
    readings: Sequence[GpuReading],
    *,
    error: str | None = None,
    run_id: str = "default",
) -> GpuSample:
    """One arm's sample of run `run_id` from the readings of all its exporters that answered
    (`up` when any did: `error` is then None). A GPU with DRAM activity uses it; one without
    falls back to its memory-copy utilisation, and `bandwidth_source` says "mem_copy_util" if
    any GPU did."""
    if error is not None:
        return GpuSample(t=t, arm=arm, up=False, run_id=run_id, error=error)
    bandwidth: list[float] = []
    fallback = False
    for r in readings:
        if r.dram_active is not None:
            bandwidth.append(r.dram_active)
        elif r.mem_copy_util is not None:
            bandwidth.append(r.mem_copy_util)
            fallback = True
    with_reasons = [r.clock_reasons for r in readings if r.clock_reasons is not None]
    active = frozenset(r for found in with_reasons for r in found) if with_reasons else None
    return GpuSample(
        t=t,
        arm=arm,
        up=True,
        run_id=run_id,
        gpus=len(readings),
        utilization=_mean(r.utilization for r in readings),
        memory_bandwidth=max(bandwidth) if bandwidth else None,
        bandwidth_source=(
            None if not bandwidth else "mem_copy_util" if fallback else "dram_active"
        ),
        sm_clock_mhz=_mean(r.sm_clock_mhz for r in readings),
        temperature_c=_max(r.temperature_c for r in readings),
        clock_reasons=tuple(sorted(active)) if active is not None else None,
        thermal_throttled=(
            any(reason in active for reason in THERMAL_CLOCK_REASONS)
            if active is not None
            else None
        ),
    )
