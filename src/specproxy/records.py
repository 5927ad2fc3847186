"""The per-request record: what the proxy measured about one request to one arm.

A record is immutable and self-contained, so the store, the statistics and the report can all be
fed from the same rows. Times are seconds; `t_start` is Unix wall-clock time, durations come from
`time.perf_counter` and are therefore monotonic.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, Final, Protocol, TypeAlias, runtime_checkable

from specproxy.errors import ErrorKind
from specproxy.fastinit import fast_init

__all__ = [
    "ARM_NAME_PATTERN",
    "BOOL_COLUMNS",
    "GPU_ERROR_MAX_CHARS",
    "MODEL_MAX_BYTES",
    "RECORD_FIELDS",
    "SHORTHAND_ARMS",
    "SHORTHAND_CONTROL",
    "SHORTHAND_TREATMENT",
    "TEXT_COLUMNS",
    "THERMAL_CLOCK_REASONS",
    "Arm",
    "EngineSample",
    "GpuRecorder",
    "GpuSample",
    "ReadBarrier",
    "Recorder",
    "RequestRecord",
    "RerouteReason",
    "arm_name",
    "bound_model",
]

# The request body's `model` is the one free-form string a client puts into every record (and
# from there into the statistics' keys): at most this many UTF-8 bytes are kept.
MODEL_MAX_BYTES = 256


def bound_model(model: str) -> str:
    """`model` as stored: at most `MODEL_MAX_BYTES` UTF-8 bytes, cut on a character boundary,
    storable by every backend (a lone surrogate becomes "?", NUL becomes U+FFFD: SQLite's and
    PostgreSQL's drivers reject the first, PostgreSQL's TEXT the second).

    The one place that bounds it: the record applies it, so every store, stats key and label
    derived from records sees a bounded value.
    """
    if len(model) <= MODEL_MAX_BYTES // 4 and model.isprintable():
        return model  # the usual name: at most 4 bytes a character, nothing to clean
    raw = model.replace("\x00", "\ufffd").encode("utf-8", "replace")
    return raw[:MODEL_MAX_BYTES].decode("utf-8", "ignore")


# An arm is a configured name (`ARM_NAME_PATTERN`, `[arms.NAME]`), not a fixed set: which
# arm is the control is a property of the run's configuration (`Config.control_arm`), never of a
# name. The alias says what a string holds.
Arm: TypeAlias = str
ARM_NAME_PATTERN: Final = re.compile(r"[a-z][a-z0-9_-]{0,31}")

# The two-arm shorthand's names (`baseline_url`/`speculative_url`): control and treatment.
SHORTHAND_CONTROL: Final = "baseline"
SHORTHAND_TREATMENT: Final = "speculative"
SHORTHAND_ARMS: Final = (SHORTHAND_TREATMENT, SHORTHAND_CONTROL)


def arm_name(text: str) -> str:
    """`text` as an arm name (`ARM_NAME_PATTERN`), else a ValueError saying what one is."""
    if ARM_NAME_PATTERN.fullmatch(text) is None:
        raise ValueError(
            f"{text[:40]!r} is no arm name (a lower-case letter, then up to 31 of a-z 0-9 _ -)"
        )
    return text


class RerouteReason(enum.StrEnum):
    """Why a request routed to a treatment was served by the control instead (fail open)."""

    DOWN = "down"  # every endpoint of the treatment was ejected: it was never tried
    CONNECT = "connect"  # no endpoint of the treatment could be connected to; nothing was sent


@fast_init  # built once per request on the event loop: slots set through their descriptors
@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as served (or shadowed) by one arm."""

    request_id: str
    run_id: str
    arm: Arm
    t_start: float
    model: str
    endpoint: str  # "completions" | "chat.completions"
    stream: bool
    status: int
    e2e_s: float  # request received -> last byte written to the client
    upstream_s: float  # upstream request sent -> last upstream byte (isolates proxy overhead)
    ttft_s: float | None = None  # request received -> first event with content
    tpot_s: float | None = None  # (e2e - ttft) / (output_tokens - 1)
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    n_events: int = 0  # SSE data events with content
    tokens_per_event: float | None = None
    mean_gap_s: float | None = None  # mean gap between consecutive content events
    max_gap_s: float | None = None
    acceptance_rate: float | None = None  # metrics.speculative_decoding.draft_acceptance_rate
    mean_acceptance_length: float | None = None
    pair_id: str | None = None  # shared by a primary request and its mirrored shadow
    shadow: bool = False  # True when the response was read for timing and never returned
    error_kind: ErrorKind | None = None  # None on success

    disconnected: bool = False  # the client went away before the response finished
    engine_url: str | None = None  # the arm's endpoint that served it (None: never sent)
    # Failing open: the treatment the request was routed to, which was down, and why; `arm` is
    # the control that answered. Such a request is in no comparison (not a sample of either arm).
    rerouted_from: Arm | None = None
    reroute_reason: RerouteReason | None = None
    # The conditions the request met (issue 26), each None when not known: the proxy's calls in
    # flight to its arm and to its endpoint when it was sent (itself included), the engine's
    # running and waiting requests at that endpoint's latest scrape, the body's `temperature`
    # (None: not given, the engine's default), and the client's bounded category (`category`).
    arm_in_flight: int | None = None
    endpoint_in_flight: int | None = None
    engine_running: float | None = None
    engine_waiting: float | None = None
    temperature: float | None = None
    category: str | None = None

    def __post_init__(self) -> None:
        bounded = bound_model(self.model)
        if bounded is not self.model:
            object.__setattr__(self, "model", bounded)
        kind = self.error_kind
        if kind is not None and type(kind) is not ErrorKind:  # a stored or hand-made string
            object.__setattr__(self, "error_kind", ErrorKind(kind))
        reason = self.reroute_reason
        if reason is not None and type(reason) is not RerouteReason:
            object.__setattr__(self, "reroute_reason", RerouteReason(reason))

    @property
    def comparable(self) -> bool:
        """Whether the record may be a sample of its arm in a comparison: HTTP 200, no error
        kind, the client still connected, and not rerouted (see `rerouted_from`)."""
        return (
            self.status == 200
            and self.error_kind is None
            and not self.disconnected
            and self.rerouted_from is None
        )

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        if self.error_kind is not None:
            row["error_kind"] = self.error_kind.value
        if self.reroute_reason is not None:
            row["reroute_reason"] = self.reroute_reason.value
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> RequestRecord:
        values = {f: row[f] for f in RECORD_FIELDS if f in row}
        return cls(**values)


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
# Record fields that are booleans (SQLite stores 0/1) and text; the others are numbers.
BOOL_COLUMNS: frozenset[str] = frozenset({"stream", "shadow", "disconnected"})
TEXT_COLUMNS: frozenset[str] = frozenset(
    {
        "request_id",
        "run_id",
        "arm",
        "model",
        "endpoint",
        "pair_id",
        "error_kind",
        "engine_url",
        "rerouted_from",
        "reroute_reason",
        "category",
    }
)


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One scrape of one arm's vLLM /metrics, reduced to version-independent quantities.

    Rates are derived from counter deltas since the previous scrape; None means "not reported"
    (e.g. the baseline has no speculative metrics), never zero.
    """

    t: float  # Unix time of the scrape
    run_id: str
    arm: Arm
    up: bool
    restarted: bool = False  # process_start_time changed or a counter went down since last scrape
    acceptance_rate: float | None = None
    mean_acceptance_length: float | None = None
    position_acceptance: tuple[float, ...] | None = None  # rate per draft position 0..k-1
    requests_running: float | None = None
    requests_waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    generation_tokens_per_s: float | None = None
    process_start_time: float | None = None

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["position_acceptance"] = (
            list(self.position_acceptance) if self.position_acceptance is not None else None
        )
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> EngineSample:
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        pos = values.get("position_acceptance")
        values["position_acceptance"] = tuple(pos) if pos is not None else None
        return cls(**values)


# The clock-event (throttle) reasons that mean "clocks cut because of heat", by dcgm-exporter's
# names (`scrape.dcgm`): SW and HW thermal slowdown, and HW slowdown (temperature, power brake or
# a power surge: the clocks were cut by >= 2x in any case).
THERMAL_CLOCK_REASONS: tuple[str, ...] = ("sw_thermal", "hw_thermal", "hw_slowdown")

# A down sample's `error` joins the arm's exporters' errors: it is cut to this many characters so
# that a stored GPU sample stays small (every other field is a number, a flag, or one of a fixed
# set of names).
GPU_ERROR_MAX_CHARS = 512


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One scrape of one arm's NVIDIA dcgm-exporters (`scrape.dcgm`), combined over the arm's
    GPUs; stored like engine samples (table `gpu_samples`). None means "not exported", never 0."""

    t: float  # Unix time of the scrape
    arm: Arm
    up: bool  # at least one of the arm's exporters answered with GPU fields
    run_id: str = "default"  # the run it belongs to (`Config.run_id`, whose default this is)
    gpus: int = 0  # GPUs (or MIG instances) read
    utilization: float | None = None  # mean over GPUs, 0..1 (DCGM_FI_DEV_GPU_UTIL / 100)
    # busiest GPU's memory-interface activity, 0..1: DCGM_FI_PROF_DRAM_ACTIVE where exported,
    # else DCGM_FI_DEV_MEM_COPY_UTIL / 100 (`bandwidth_source` says which)
    memory_bandwidth: float | None = None
    bandwidth_source: str | None = None  # "dram_active" | "mem_copy_util"
    sm_clock_mhz: float | None = None  # mean over GPUs
    temperature_c: float | None = None  # hottest GPU
    # every clock-event (throttle) reason active on any GPU, by dcgm-exporter's names; None when
    # the exporters do not export the reasons field
    clock_reasons: tuple[str, ...] | None = None
    thermal_throttled: bool | None = None  # one of THERMAL_CLOCK_REASONS is active
    error: str | None = None  # why no exporter could be read (up=False); <= GPU_ERROR_MAX_CHARS

    def __post_init__(self) -> None:
        if self.error is not None and len(self.error) > GPU_ERROR_MAX_CHARS:
            object.__setattr__(self, "error", self.error[: GPU_ERROR_MAX_CHARS - 3] + "...")
        reasons = self.clock_reasons
        if reasons is not None and type(reasons) is not tuple:  # a stored or decoded list
            object.__setattr__(self, "clock_reasons", tuple(reasons))

    def to_dict(self) -> dict[str, Any]:
        row = asdict(self)
        row["clock_reasons"] = list(self.clock_reasons) if self.clock_reasons is not None else None
        return row

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> GpuSample:
        values = {f.name: row[f.name] for f in fields(cls) if f.name in row}
        return cls(**values)


class Recorder(Protocol):
    """Where the proxy and the scraper hand finished rows. Both calls never block or raise."""

    def record(self, rec: RequestRecord) -> None: ...

    def record_engine(self, sample: EngineSample) -> None: ...


@runtime_checkable
class ReadBarrier(Protocol):
    """A recorder whose readers must see every call already over: the proxy makes its records
    in the loop's spare moment (`proxy.backlog`), and hands the recorder the barrier (`settle`)
    that its reads call first."""

    def before_reads(self, settle: Callable[[], None]) -> None: ...


@runtime_checkable
class GpuRecorder(Protocol):
    """Where the GPU scraper hands its samples (the store); never blocks or raises. A recorder
    without it (the in-memory ring of a proxy with no store) keeps no GPU history."""

    def record_gpu(self, sample: GpuSample) -> None: ...
