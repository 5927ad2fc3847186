"""One typed, validated configuration object for every part of specproxy.

`Config` is built once at start-up, from a TOML file (`Config.from_toml`), a mapping
(`Config.from_mapping`, which the CLI uses after merging its flags), or keyword arguments in tests.
Every problem is a `ConfigError` that names the setting, so a bad config fails before the proxy
accepts its first request. The TOML file mirrors the dataclasses: top-level keys plus the tables
`[routing]`, `[timeouts]`, `[store]`, `[scrape]`, `[stats]`, `[warmup]` and `[outlier]`.

The arms are named tables, any number from `MIN_ARMS` to `MAX_ARMS`, exactly one of them the
control (README, "A/B/n"):

    [arms.baseline]
    role = "control"
    urls = ["http://10.0.0.2:8000"]
    [arms.ngram-k4]
    role = "treatment"
    weight = 1            # weights are normalised: each arm's share is weight / sum of weights
    urls = ["http://10.0.0.3:8000"]
    labels = { method = "ngram", k = "4" }

The two-arm case keeps its shorthand: control "baseline" and treatment "speculative", from
`baseline_url`/`speculative_url` (one endpoint each), `[baseline]`/`[speculative]` tables,
`routing.speculative_share` and `[timeouts.speculative]`/`[timeouts.baseline]`. Mixing the
shorthand with `[arms]` is a `ConfigError`. Each arm is a pool of engine endpoints:

    [speculative]
    urls = ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]   # a fixed list, or
    [baseline]
    dns = "vllm-base.llm.svc.cluster.local"   # a name resolved every refresh_s (headless Service)
    port = 8000
    refresh_s = 30
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from specproxy.errors import ConfigError
from specproxy.records import ARM_NAME_PATTERN, SHORTHAND_CONTROL, SHORTHAND_TREATMENT
from specproxy.store.registry import STORE_SCHEMES

__all__ = [
    "ARM_LABELS_MAX",
    "ARM_LABEL_VALUE_MAX_CHARS",
    "MAX_ARMS",
    "MIN_ARMS",
    "MOVED",
    "ArmConfig",
    "Config",
    "ControlConfig",
    "OutlierConfig",
    "RampConfig",
    "RoutingConfig",
    "ScrapeConfig",
    "SegmentsConfig",
    "StatsConfig",
    "StoreConfig",
    "TelemetryConfig",
    "TimeoutConfig",
    "WarmupConfig",
    "did_you_mean",
    "load_toml",
    "moved_settings",
    "section",
]

log = logging.getLogger(__name__)

_DEFAULT_SHARE: Final = 0.5  # the shorthand's routing.speculative_share
RoutingMode = Literal["weighted", "sticky"]
StickySource = Literal["header", "user"]
StatsCompute = Literal["child", "external"]
RollupMode = Literal["inline", "deferred"]
OnDown = Literal["control", "error"]
ArmAuthorization = Literal["client", "arm"]
# Header names an arm's `headers` may not set: the API key has its own settings, the rest are
# hop-by-hop, recomputed per request or the proxy's own.
_RESERVED_ARM_HEADERS: Final = frozenset(
    {
        "authorization",
        "connection",
        "content-length",
        "expect",
        "host",
        "keep-alive",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
_TOKEN_CHARS: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyz")
ArmRole = Literal["control", "treatment"]

MIN_ARMS: Final = 2
MAX_ARMS: Final = 8  # bounds every `arm` label and the comparisons computed every tick
ARM_LABELS_MAX: Final = 16  # free-form labels per arm (method, k, temperature, ...)
ARM_LABEL_KEY_PATTERN: Final = re.compile(r"[a-z_][a-z0-9_]{0,31}")
ARM_LABEL_VALUE_MAX_CHARS: Final = 64
_SHORTHAND_KEYS: Final = ("baseline_url", "speculative_url", "baseline", "speculative")


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """How requests are split between the arms."""

    mode: RoutingMode = "weighted"
    speculative_share: float = _DEFAULT_SHARE  # probability (weighted) or key-space share (sticky)
    sticky_source: StickySource = "header"
    sticky_header: str = "x-session-id"
    allow_forced_arm: bool = False  # honour the `x-specproxy-arm` request header
    mirror_fraction: float = 0.0  # share of requests also sent to the other arm as a shadow
    max_concurrent_shadows: int = 8  # shadows beyond this are skipped, never queued
    seed: int | None = None  # seed of the routing RNG (tests, reproducible demos)

    def __post_init__(self) -> None:
        _check(self.mode in get_args(RoutingMode), "routing.mode", "must be weighted or sticky")
        _check(
            self.sticky_source in get_args(StickySource),
            "routing.sticky_source",
            "must be header or user",
        )
        _check(
            0.0 <= self.speculative_share <= 1.0, "routing.speculative_share", "must be in [0, 1]"
        )
        _check(0.0 <= self.mirror_fraction <= 1.0, "routing.mirror_fraction", "must be in [0, 1]")
        _check(self.max_concurrent_shadows >= 0, "routing.max_concurrent_shadows", "must be >= 0")
        _check(bool(self.sticky_header.strip()), "routing.sticky_header", "must not be empty")


TIMEOUT_KEYS = ("connect_s", "read_s", "total_s", "stream_total_s")


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    """Upstream timeouts, chosen for LLM generation (README, "Limits and timeouts").

    A stream sends an event every engine step (tens of ms) once it has started, so silence means a
    hung engine: `read_s` bounds it, before the first byte too (queueing + prefill). A
    non-streaming call is silent until the whole generation is done, so silence means nothing
    there: `total_s` bounds the whole call instead (openai-python's own default, so the proxy never
    gives up before a standard client would). `stream_total_s` caps a stream as a whole (a slow
    drip that never falls silent), None for no cap. `[timeouts.speculative]` and
    `[timeouts.baseline]` override any of these for one arm; unset keys come from `[timeouts]`.
    """

    connect_s: float = 5.0
    read_s: float = 120.0  # a stream: longest silence between two upstream bytes
    total_s: float = 600.0  # a non-streaming call: deadline of the whole answer
    stream_total_s: float | None = 3600.0  # a stream: deadline of the whole stream (None: none)
    speculative: TimeoutConfig | Mapping[str, Any] | None = None  # this arm's overrides
    baseline: TimeoutConfig | Mapping[str, Any] | None = None  # this arm's overrides

    def __post_init__(self) -> None:
        _check(self.connect_s > 0, "timeouts.connect_s", "must be > 0")
        _check(self.read_s > 0, "timeouts.read_s", "must be > 0")
        _check(self.total_s > 0, "timeouts.total_s", "must be > 0")
        _check(
            self.stream_total_s is None or self.stream_total_s > 0,
            "timeouts.stream_total_s",
            "must be > 0 (or unset for no cap)",
        )
        own = {key: getattr(self, key) for key in TIMEOUT_KEYS}
        for arm in ("speculative", "baseline"):
            override = getattr(self, arm)
            if override is None:
                continue
            if isinstance(override, TimeoutConfig):
                override = {key: getattr(override, key) for key in TIMEOUT_KEYS}
            _check(isinstance(override, Mapping), f"timeouts.{arm}", "must be a table")
            merged = _build(TimeoutConfig, {**own, **override}, prefix=f"timeouts.{arm}.")
            _check(
                merged.speculative is None and merged.baseline is None,
                f"timeouts.{arm}",
                "cannot override another arm",
            )
            object.__setattr__(self, arm, merged)

    def longest_s(self) -> float | None:
        """The longest a request can last under these timeouts: the connect plus the longer of
        the non-streaming deadline and the stream cap (None: streams have no cap)."""
        if self.stream_total_s is None:
            return None
        return self.connect_s + max(self.total_s, self.stream_total_s)

    def for_arm(self, arm: str) -> TimeoutConfig:
        """The timeouts of one arm: its overrides over this table."""
        override = self.speculative if arm == "speculative" else self.baseline
        return override if isinstance(override, TimeoutConfig) else self


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where per-request records go."""

    url: str = "sqlite:///specproxy.db"
    flush_interval_s: float = 0.5
    batch_size: int = 2000
    max_buffer: int = 200_000  # records held in memory before spilling to `spill_path`
    spill_path: str = "specproxy-spill.jsonl"
    # raw rows (requests, engine and GPU samples, stats history); None = keep
    retention_days: float | None = None
    # per-minute rollups (the statistics of big windows); kept longer than rows. None = keep
    rollup_retention_days: float | None = None
    # Who computes the rollups of the request rows. "inline": each write computes and upserts
    # them with the rows (the rollups are current as soon as the rows are). "deferred": the
    # write marks its rows pending and the stats leader folds them into the rollups before each
    # tick (`Store.fold_pending`), so a proxy's core spends nothing on them; a reader that does
    # not lead (the report, a one-shot `specproxy stats`) sees them as of the leader's last fold.
    rollups: RollupMode = "inline"

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        _check(
            scheme != "",
            "store.url",
            f"has no scheme: for a SQLite file write sqlite:///{self.url}",
        )
        _check(
            scheme in STORE_SCHEMES,
            "store.url",
            f"scheme {scheme!r} is not one of {', '.join(f'{s}://' for s in STORE_SCHEMES)}",
        )
        rest = self.url[len(scheme) + 1 :]
        _check(
            scheme != "sqlite" or rest.startswith("//"),
            "store.url",
            f"{self.url!r} needs three slashes: sqlite:///{rest.lstrip('/')} (a relative file)"
            f" or sqlite:////{rest.lstrip('/')} (an absolute one)",
        )
        _check(self.rollups in get_args(RollupMode), "store.rollups", "must be inline or deferred")
        _check(0 < self.flush_interval_s <= 1.0, "store.flush_interval_s", "must be in (0, 1]")
        _check(self.batch_size > 0, "store.batch_size", "must be > 0")
        _check(self.max_buffer > 0, "store.max_buffer", "must be > 0")
        _check(
            self.retention_days is None or self.retention_days > 0,
            "store.retention_days",
            "must be > 0",
        )
        rollup = self.rollup_retention_days
        _check(
            rollup is None or (self.retention_days is not None and rollup >= self.retention_days),
            "store.rollup_retention_days",
            "needs store.retention_days and must be at least it (rollups outlive raw rows)",
        )


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Polling of each arm's /metrics."""

    interval_s: float = 5.0
    timeout_s: float = 3.0

    def __post_init__(self) -> None:
        _check(self.interval_s > 0, "scrape.interval_s", "must be > 0")
        _check(self.timeout_s > 0, "scrape.timeout_s", "must be > 0")


@dataclass(frozen=True, slots=True)
class SegmentsConfig:
    """The client's category of a request (`proxy.conditions`): the header it is read from, and
    how many distinct values one proxy process keeps before the rest are "other"."""

    category_header: str = "x-specproxy-category"
    categories_max: int = 16

    def __post_init__(self) -> None:
        header = self.category_header
        _check(
            bool(header)
            and len(header) <= 64
            and all(c.isascii() and (c.isalnum() or c in "-_") for c in header),
            "segments.category_header",
            "must be a header name of 1-64 ASCII letters, digits, '-' or '_'",
        )
        _check(1 <= self.categories_max <= 64, "segments.categories_max", "must be in [1, 64]")


@dataclass(frozen=True, slots=True)
class ControlConfig:
    """Runtime arm control (`specproxy.control`): how often each replica reads new arm events.

    A change made through any replica is applied by every replica within `poll_s` plus the
    store's write latency (the replica that took it applies it at once)."""

    poll_s: float = 2.0

    def __post_init__(self) -> None:
        _check(0 < self.poll_s <= 3600, "control.poll_s", "must be in (0, 3600]")


@dataclass(frozen=True, slots=True)
class TelemetryConfig:
    """Traces and the access log (`proxy.tracing`, `proxy.accesslog`), both off by default.

    With `otlp_traces_endpoint` every measured request is a server span with a client span for
    its upstream call, exported over OTLP/HTTP (`pip install 'specproxy[otel]'`) and propagated
    upstream (`traceparent`), so vLLM's own spans (`--otlp-traces-endpoint`) join the trace."""

    otlp_traces_endpoint: str | None = None  # e.g. http://otel-collector:4318/v1/traces
    service_name: str = "specproxy"  # the spans' service.name
    # One JSON line per request on stderr (`proxy.accesslog`): arm, status, e2e, TTFT, error
    # kind. Bounded: at most access_log_per_s lines a second for answered requests and as many
    # again for errors (a flood of one never hides the other); a line after dropped ones says
    # how many.
    access_log: bool = False
    access_log_per_s: float = 100.0

    def __post_init__(self) -> None:
        endpoint = self.otlp_traces_endpoint
        _check(
            endpoint is None or (_is_str(endpoint) and _is_http_url(endpoint)),
            "telemetry.otlp_traces_endpoint",
            f"must be an absolute http(s) URL (…/v1/traces), got {endpoint!r}",
        )
        _check(
            _is_str(self.service_name) and bool(self.service_name.strip()),
            "telemetry.service_name",
            "must be a non-empty string",
        )
        _check(isinstance(self.access_log, bool), "telemetry.access_log", "must be true or false")
        _check(
            0 < self.access_log_per_s <= 100_000,
            "telemetry.access_log_per_s",
            "must be in (0, 100000]",
        )


@dataclass(frozen=True, slots=True)
class RampConfig:
    """The guarded ramp (`control.ramp`, run by the stats leader each interval): each treatment
    arm named in `arms` (empty: every treatment) steps through `schedule`, staying at least
    `min_samples` usable treatment requests and `min_minutes` at each step, while no guard fails,
    and is set to 0 at once when one fails. `dry_run`: log and export, write no event."""

    enabled: bool = False
    schedule: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5)
    min_samples: int = 1000
    min_minutes: float = 10.0
    dry_run: bool = False
    arms: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("schedule", "arms"):
            values = getattr(self, key)
            _check(isinstance(values, (list, tuple)), f"ramp.{key}", "must be a list")
            object.__setattr__(self, key, tuple(values))
        steps = self.schedule
        _check(bool(steps), "ramp.schedule", "must name at least one weight")
        _check(
            all(type(w) in (int, float) for w in steps)
            and all(0.0 < w <= 1.0 for w in steps)
            and all(steps[i] < steps[i + 1] for i in range(len(steps) - 1)),
            "ramp.schedule",
            "must be increasing weights in (0, 1]",
        )
        _check(self.min_samples >= 1, "ramp.min_samples", "must be >= 1")
        _check(self.min_minutes >= 0, "ramp.min_minutes", "must be >= 0")


@dataclass(frozen=True, slots=True)
class WarmupConfig:
    """What each arm leaves out of the statistics while its engine warms up (`stats.warmup`)."""

    requests: int = 20  # usable requests per arm after the start of the run
    restart_requests: int = 20  # usable requests after each engine restart
    restart_seconds: float = 30.0  # and every request within this long of a restart

    def __post_init__(self) -> None:
        _check(self.requests >= 0, "warmup.requests", "must be >= 0")
        _check(self.restart_requests >= 0, "warmup.restart_requests", "must be >= 0")
        _check(self.restart_seconds >= 0, "warmup.restart_seconds", "must be >= 0")


@dataclass(frozen=True, slots=True)
class StatsConfig:
    """The periodic comparison job.

    `compute` says which process computes it (`stats.job.process`). "child": `specproxy serve`
    starts one `specproxy stats --follow` process beside it (the `--workers` parent starts it,
    not each worker). "external": this proxy computes nothing, another process does (a
    `specproxy stats --follow` Deployment). Either way the proxy serves the latest result the
    computing process stored. A `memory://` store is the exception: no other process can read
    it, so its statistics run inside the proxy whatever `compute` says.

    Windows end at now at the latest: a row stamped more than `future_skew_s` (default 5 s)
    after now (a clock stepped back, a replica's clock running fast on a shared store) is in no
    window, and the result counts it (`future_rows`, `specproxy_stats_future_rows`).
    """

    interval_s: float = 15.0
    windows_s: tuple[float | None, ...] = (300.0, 3600.0, None)  # None = the whole run
    resamples: int = 2000
    confidence: float = 0.95
    alpha: float = 0.05  # error rate of the anytime-valid tests
    p99_tolerance: float = 0.05  # "slower" means spec P99 > baseline P99 * (1 + tolerance)
    seed: int = 0
    compute: StatsCompute = "child"
    # How far past now a row's timestamp may be and still count (a replica's clock a little
    # ahead); rows stamped later are left out of every window and reported as future rows.
    future_skew_s: float = 5.0

    def __post_init__(self) -> None:
        _check(self.interval_s > 0, "stats.interval_s", "must be > 0")
        _check(self.future_skew_s >= 0, "stats.future_skew_s", "must be >= 0")
        _check(self.compute in get_args(StatsCompute), "stats.compute", "must be child or external")
        _check(len(self.windows_s) > 0, "stats.windows_s", "must name at least one window")
        _check(
            all(w is None or w > 0 for w in self.windows_s),
            "stats.windows_s",
            "windows must be > 0 seconds (or omitted for the whole run)",
        )
        _check(self.resamples >= 100, "stats.resamples", "must be >= 100")
        _check(0.5 < self.confidence < 1.0, "stats.confidence", "must be in (0.5, 1)")
        _check(0.0 < self.alpha < 0.5, "stats.alpha", "must be in (0, 0.5)")
        _check(self.p99_tolerance >= 0, "stats.p99_tolerance", "must be >= 0")


@dataclass(frozen=True, slots=True)
class ArmConfig:
    """The engine endpoints of one arm: a fixed list of base URLs, or a DNS name to resolve."""

    urls: tuple[str, ...] = ()
    dns: str | None = None  # resolved to every address behind it (a headless Service's pods)
    port: int = 8000  # with `dns`
    scheme: str = "http"  # with `dns`
    refresh_s: float = 30.0  # with `dns`: how often the name is resolved again
    # Optional GPU telemetry (`scrape.dcgm`): NVIDIA dcgm-exporter base URLs (port 9400) of the
    # nodes running this arm's engines, scraped every scrape.interval_s; () = none
    dcgm_urls: tuple[str, ...] = ()
    # with dcgm_urls: the GPUs (`gpu` index or `UUID` label) this arm's engines use; () = all
    dcgm_gpus: tuple[str, ...] = ()
    # with dcgm_urls on Kubernetes: only GPUs whose `pod` label starts with one of these; () = all
    dcgm_pods: tuple[str, ...] = ()
    # A treatment arm with no healthy endpoint: "control" sends its requests to the control arm
    # (fail open: recorded as rerouted, kept out of the comparison); "error" answers them with
    # the arm's errors. The control arm (baseline) never fails over: this key is ignored there.
    on_down: OnDown = "control"
    # The arm's endpoints may be a gateway or router (LiteLLM, production-stack's router): then
    # scrape the engines behind it directly, by base URL or by a (headless Service) name
    # resolved at metrics_port; () / None = scrape the arm's endpoints themselves.
    metrics_urls: tuple[str, ...] = ()
    metrics_dns: str | None = None
    metrics_port: int = 8000  # with metrics_dns
    # Extra headers on every request to this arm (a gateway's tenant or routing headers); they
    # replace a client's header of the same name. Never Authorization: see api_key_file.
    headers: dict[str, str] = field(default_factory=dict)
    # The arm's API key (sent as `Authorization: Bearer <key>`), read at start-up from a file
    # (a mounted Secret) or from the environment variable named here; never a flag.
    api_key_file: str | None = None
    api_key_env: str | None = None
    # With a key: "client" keeps a client's own Authorization and sends the key only for
    # clients without one; "arm" replaces every client's Authorization with the key.
    authorization: ArmAuthorization = "client"
    name: str = "arm"  # the arm, for error messages (set by Config)
    # With `[arms.NAME]` tables (the shorthand sets these from its own keys):
    role: ArmRole = "treatment"  # exactly one arm is the control
    weight: float = 1.0  # relative; the arm's share of the traffic is weight / sum of weights
    labels: Mapping[str, str] = field(default_factory=dict)  # shown by dashboard and report
    timeouts: Mapping[str, Any] | None = None  # this arm's overrides of [timeouts]

    def __post_init__(self) -> None:
        prefix = self.name
        _check(self.role in get_args(ArmRole), f"{prefix}.role", "must be control or treatment")
        _check(math.isfinite(self.weight) and self.weight >= 0, f"{prefix}.weight", "must be >= 0")
        object.__setattr__(self, "labels", _arm_labels(self.labels, f"{prefix}.labels"))
        if self.timeouts is not None:
            _check(isinstance(self.timeouts, Mapping), f"{prefix}.timeouts", "must be a table")
            unknown = sorted(set(self.timeouts) - set(TIMEOUT_KEYS))
            _check(not unknown, f"{prefix}.timeouts", f"has unknown key(s): {', '.join(unknown)}")
            object.__setattr__(self, "timeouts", dict(self.timeouts))
        _check(
            isinstance(self.urls, (list, tuple)), f"{prefix}.urls", "must be a list of base URLs"
        )
        object.__setattr__(self, "urls", tuple(self.urls))
        _check(
            not (self.urls and self.dns is not None),
            prefix,
            "needs exactly one of urls (a list of base URLs) or dns (a name to resolve)",
        )
        _check(self.on_down in get_args(OnDown), f"{prefix}.on_down", "must be control or error")
        for url in self.urls:
            _check(
                _is_str(url) and _is_http_url(url),
                f"{prefix}.urls",
                f"must be absolute http(s) URLs (scheme, host, port), got {url!r}",
            )
        if self.dns is not None:
            _check(
                _is_str(self.dns) and bool(self.dns.strip()) and "/" not in self.dns,
                f"{prefix}.dns",
                "must be a host name",
            )
        _check(0 < self.port <= 65535, f"{prefix}.port", "must be in [1, 65535]")
        _check(self.scheme in ("http", "https"), f"{prefix}.scheme", "must be http or https")
        _check(self.refresh_s > 0, f"{prefix}.refresh_s", "must be > 0")
        for key in ("dcgm_urls", "dcgm_gpus", "dcgm_pods"):
            values = getattr(self, key)
            _check(isinstance(values, (list, tuple)), f"{prefix}.{key}", "must be a list")
            object.__setattr__(self, key, tuple(values))
        for url in self.dcgm_urls:
            _check(
                _is_str(url) and _is_http_url(url),
                f"{prefix}.dcgm_urls",
                f"must be absolute http(s) URLs of dcgm-exporters, got {url!r}",
            )
        _check(
            len(set(self.dcgm_urls)) == len(self.dcgm_urls), f"{prefix}.dcgm_urls", "has duplicates"
        )
        _check(
            all(_is_str(g) and g.strip() for g in self.dcgm_gpus),
            f"{prefix}.dcgm_gpus",
            "must be a list of GPU indices or UUIDs, as strings",
        )
        _check(
            all(_is_str(pod) and pod.strip() for pod in self.dcgm_pods),
            f"{prefix}.dcgm_pods",
            "must be a list of pod-name prefixes",
        )
        for key in ("dcgm_gpus", "dcgm_pods"):
            _check(
                not getattr(self, key) or bool(self.dcgm_urls), f"{prefix}.{key}", "needs dcgm_urls"
            )
        self._check_metrics_targets()
        self._check_headers()

    def _check_metrics_targets(self) -> None:
        prefix = self.name
        _check(
            isinstance(self.metrics_urls, (list, tuple)),
            f"{prefix}.metrics_urls",
            "must be a list of base URLs",
        )
        object.__setattr__(self, "metrics_urls", tuple(self.metrics_urls))
        _check(
            not (self.metrics_urls and self.metrics_dns is not None),
            prefix,
            "takes metrics_urls or metrics_dns, not both",
        )
        for url in self.metrics_urls:
            _check(
                _is_str(url) and _is_http_url(url),
                f"{prefix}.metrics_urls",
                f"must be absolute http(s) URLs of engines, got {url!r}",
            )
        _check(
            len(set(self.metrics_urls)) == len(self.metrics_urls),
            f"{prefix}.metrics_urls",
            "has duplicates",
        )
        if self.metrics_dns is not None:
            _check(
                _is_str(self.metrics_dns)
                and bool(self.metrics_dns.strip())
                and "/" not in self.metrics_dns,
                f"{prefix}.metrics_dns",
                "must be a host name",
            )
        _check(0 < self.metrics_port <= 65535, f"{prefix}.metrics_port", "must be in [1, 65535]")

    def _check_headers(self) -> None:
        prefix = self.name
        _check(isinstance(self.headers, Mapping), f"{prefix}.headers", "must be a table")
        object.__setattr__(self, "headers", dict(self.headers))
        for key, value in self.headers.items():
            _check(
                _is_str(key) and bool(key) and set(key.lower()) <= _TOKEN_CHARS,
                f"{prefix}.headers",
                f"has a bad header name {key!r}",
            )
            _check(
                key.lower() not in _RESERVED_ARM_HEADERS
                and not key.lower().startswith("x-specproxy-"),
                f"{prefix}.headers",
                f"may not set {key} (an API key: api_key_file or api_key_env)"
                if key.lower() == "authorization"
                else f"may not set {key}",
            )
            _check(
                _is_str(value) and not any(c in value for c in "\r\n\0"),
                f"{prefix}.headers",
                f"{key} must be a string without CR, LF or NUL",
            )
        _check(
            self.api_key_file is None or self.api_key_env is None,
            prefix,
            "takes api_key_file or api_key_env, not both",
        )
        for key in ("api_key_file", "api_key_env"):
            value = getattr(self, key)
            _check(
                value is None or (_is_str(value) and bool(value.strip())),
                f"{prefix}.{key}",
                "must be a non-empty string",
            )
        _check(
            self.authorization in get_args(ArmAuthorization),
            f"{prefix}.authorization",
            "must be client or arm",
        )
        _check(
            self.authorization == "client" or self.has_api_key,
            f"{prefix}.authorization",
            '= "arm" needs an API key (api_key_file or api_key_env)',
        )

    @property
    def has_api_key(self) -> bool:
        """Whether the arm has an API key of its own (read at start-up)."""
        return self.api_key_file is not None or self.api_key_env is not None

    @property
    def scrapes_elsewhere(self) -> bool:
        """Whether /metrics is read from other URLs than the arm's endpoints (a gateway arm)."""
        return bool(self.metrics_urls) or self.metrics_dns is not None

    @property
    def is_control(self) -> bool:
        return self.role == "control"

    @property
    def has_endpoints(self) -> bool:
        """Whether the table names the endpoints (else the `<arm>_url` shorthand gives them)."""
        return bool(self.urls) or self.dns is not None

    @property
    def first_url(self) -> str:
        """One base URL of the arm (without a trailing slash): the first one, or the DNS name."""
        if self.urls:
            return self.urls[0].rstrip("/")
        return f"{self.scheme}://{self.dns}:{self.port}"


@dataclass(frozen=True, slots=True)
class OutlierConfig:
    """Passive health of an arm's endpoints (Envoy-style consecutive-failure ejection)."""

    eject_after_failures: int = 5  # consecutive failed requests; 0 disables ejection
    base_ejection_s: float = 30.0  # the n-th ejection lasts n times this ...
    max_ejection_s: float = 300.0  # ... at most this

    def __post_init__(self) -> None:
        _check(self.eject_after_failures >= 0, "outlier.eject_after_failures", "must be >= 0")
        _check(self.base_ejection_s > 0, "outlier.base_ejection_s", "must be > 0")
        _check(
            self.max_ejection_s >= self.base_ejection_s,
            "outlier.max_ejection_s",
            "must be >= outlier.base_ejection_s",
        )


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the proxy needs. Upstreams come only from here: the proxy is never open."""

    baseline_url: str = ""  # shorthand for [baseline] urls = [baseline_url]
    speculative_url: str = ""  # shorthand for [speculative] urls = [speculative_url]
    host: str = "127.0.0.1"
    port: int = 8000
    run_id: str = "default"
    inject_usage: bool = True  # ask upstream for the usage chunk, strip it if the client didn't
    max_body_bytes: int = 32 * 1024 * 1024
    max_event_bytes: int = 1024 * 1024  # one SSE event from an engine; larger ends the stream
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    warmup: WarmupConfig = field(default_factory=WarmupConfig)
    baseline: ArmConfig | None = None  # the arm's endpoints; None: from baseline_url
    speculative: ArmConfig | None = None  # the arm's endpoints; None: from speculative_url
    outlier: OutlierConfig = field(default_factory=OutlierConfig)
    control: ControlConfig = field(default_factory=ControlConfig)
    telemetry: TelemetryConfig = field(default_factory=TelemetryConfig)
    segments: SegmentsConfig = field(default_factory=SegmentsConfig)
    ramp: RampConfig = field(default_factory=RampConfig)
    model_allow: tuple[str, ...] = ()  # `model` label values kept besides the served models
    protect_metrics: bool = False  # with an admin token (specproxy.admin), /metrics needs it too
    # {name: arm} from `[arms.NAME]` tables; None: the two-arm shorthand builds it
    arms: Mapping[str, ArmConfig] | None = None

    def __post_init__(self) -> None:
        shorthand = any(getattr(self, key) not in ("", None) for key in _SHORTHAND_KEYS)
        if self.arms is not None and not (shorthand and set(self.arms) == set(_SHORTHAND_ARMS)):
            self._named_arms()
        else:  # the shorthand (or a copy of a shorthand config: `dataclasses.replace`)
            self._shorthand_arms()
        _check(isinstance(self.model_allow, (list, tuple)), "model_allow", "must be a list")
        object.__setattr__(self, "model_allow", tuple(self.model_allow))
        _check(
            all(_is_str(m) and m for m in self.model_allow),
            "model_allow",
            "must be a list of non-empty strings",
        )
        _check(0 <= self.port <= 65535, "port", "must be in [0, 65535]")
        _check(bool(self.run_id.strip()), "run_id", "must not be empty")
        _check(self.max_body_bytes > 0, "max_body_bytes", "must be > 0")
        _check(self.max_event_bytes > 0, "max_event_bytes", "must be > 0")
        unknown = [name for name in self.ramp.arms if name not in self.treatment_arms]
        _check(
            not unknown,
            "ramp.arms",
            f"names no treatment arm: {', '.join(unknown)} (treatments:"
            f" {', '.join(self.treatment_arms)})",
        )

    def _named_arms(self) -> None:
        arms = self.arms
        _check(isinstance(arms, Mapping), "arms", "must be a table of [arms.NAME] tables")
        assert arms is not None
        mixed = [key for key in _SHORTHAND_KEYS if getattr(self, key) not in ("", None)]
        if self.timeouts.speculative is not None or self.timeouts.baseline is not None:
            mixed.append("[timeouts.speculative]/[timeouts.baseline]")
        if self.routing.speculative_share != _DEFAULT_SHARE:
            mixed.append("routing.speculative_share")
        _check(
            not mixed,
            "arms",
            f"cannot be mixed with the two-arm shorthand ({', '.join(mixed)}): give every arm"
            " as an [arms.NAME] table (weight, timeouts and endpoints inside it)",
        )
        _check(
            MIN_ARMS <= len(arms) <= MAX_ARMS,
            "arms",
            f"must name {MIN_ARMS} to {MAX_ARMS} arms, got {len(arms)}",
        )
        built: dict[str, ArmConfig] = {}
        for name, arm in arms.items():
            _check(
                _is_str(name) and ARM_NAME_PATTERN.fullmatch(name) is not None,
                f"arms.{name}",
                "is no valid arm name (a lower-case letter, then up to 31 of a-z 0-9 _ -)",
            )
            if isinstance(arm, Mapping):
                arm = _build(ArmConfig, {**arm, "name": f"arms.{name}"}, prefix=f"arms.{name}.")
            _check(isinstance(arm, ArmConfig), f"arms.{name}", "must be a table")
            _check(
                arm.has_endpoints,
                f"arms.{name}",
                "needs exactly one of urls (a list of base URLs) or dns (a name to resolve)",
            )
            built[name] = dataclasses.replace(arm, name=name)
        controls = [name for name, arm in built.items() if arm.is_control]
        _check(
            len(controls) == 1,
            "arms",
            f'must have exactly one arm with role = "control", got {len(controls)}'
            + (f" ({', '.join(controls)})" if controls else ""),
        )
        _check(sum(arm.weight for arm in built.values()) > 0, "arms", "weights must not all be 0")
        object.__setattr__(self, "arms", built)

    def _shorthand_arms(self) -> None:
        for arm in _SHORTHAND_ARMS:
            table = getattr(self, arm)
            _check(
                table is None or (table.role in ("treatment", _ROLES[arm]) and table.weight == 1.0),
                arm,
                "role and weight are the shorthand's own (routing.speculative_share); give every"
                " arm as an [arms.NAME] table to set them",
            )
            name = f"{arm}_url"
            url, pool = getattr(self, name), getattr(self, arm)
            if pool is not None and not pool.has_endpoints:
                # A table of settings only (on_down): the shorthand URL is its one endpoint.
                _check(
                    _is_http_url(url),
                    arm,
                    "needs exactly one of urls (a list of base URLs) or dns (a name to resolve)"
                    f" (or {name} beside it)",
                )
                pool = dataclasses.replace(pool, urls=(url,))
                url = ""
            _check(url == "" or pool is None, name, f"and [{arm}] cannot both be given")
            if pool is None:
                _check(
                    _is_http_url(url),
                    name,
                    f"must be an absolute http(s) URL (scheme, host, port), got {url!r}"
                    + _one_url_hint(url, arm)
                    if url
                    else f"is required (or a [{arm}] table with urls or dns)",
                )
                pool = ArmConfig(urls=(url,), name=arm)
            elif pool.name != arm:
                pool = dataclasses.replace(pool, name=arm)
            object.__setattr__(self, arm, pool)
            object.__setattr__(self, name, pool.first_url)
        share = self.routing.speculative_share
        base, spec = self.baseline, self.speculative
        assert base is not None and spec is not None
        object.__setattr__(
            self,
            "arms",
            {
                SHORTHAND_CONTROL: dataclasses.replace(base, role="control", weight=1.0 - share),
                SHORTHAND_TREATMENT: dataclasses.replace(spec, role="treatment", weight=share),
            },
        )

    @property
    def shorthand(self) -> bool:
        """Whether the arms came from the two-arm shorthand (not from `[arms.NAME]` tables)."""
        return self.baseline is not None

    @property
    def arm_names(self) -> tuple[str, ...]:
        """Every arm, the control first, then the treatments in configured order."""
        return (self.control_arm, *self.treatment_arms)

    @property
    def control_arm(self) -> str:
        """The name of the one control arm."""
        return next(name for name, arm in self._arms.items() if arm.is_control)

    @property
    def treatment_arms(self) -> tuple[str, ...]:
        """The treatments' names, in configured order."""
        return tuple(name for name, arm in self._arms.items() if not arm.is_control)

    @property
    def arm_labels(self) -> dict[str, dict[str, str]]:
        """{arm: its labels} of the arms that have any (`[arms.NAME] labels`), control first."""
        return {
            name: dict(self._arms[name].labels)
            for name in self.arm_names
            if self._arms[name].labels
        }

    def arm_shares(self) -> dict[str, float]:
        """{arm: its share of the traffic}: the weights normalised to sum 1, control first."""
        arms = self._arms
        total = sum(arm.weight for arm in arms.values())
        return {name: arms[name].weight / total for name in self.arm_names}

    def upstream_url(self, arm: str) -> str:
        """The (first) base URL of an arm, without a trailing slash."""
        return self.arm_config(arm).first_url

    def arm_config(self, arm: str) -> ArmConfig:
        """The endpoints and settings of an arm (the shorthand URL as a one-endpoint list)."""
        return self._arms[arm]

    def arm_timeouts(self, arm: str) -> TimeoutConfig:
        """The timeouts of one arm: its overrides (`[arms.NAME.timeouts]`, or the shorthand's
        `[timeouts.<arm>]`) over `[timeouts]`."""
        override = self._arms[arm].timeouts
        if override is None:
            return self.timeouts.for_arm(arm)
        own = {key: getattr(self.timeouts, key) for key in TIMEOUT_KEYS}
        return _build(TimeoutConfig, {**own, **override}, prefix=f"arms.{arm}.timeouts.")

    @property
    def _arms(self) -> Mapping[str, ArmConfig]:
        arms = self.arms
        assert arms is not None  # set by __post_init__
        return arms

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Config:
        """Build from plain data (parsed TOML, merged CLI flags); unknown keys are errors."""
        sections: dict[str, type[Any]] = {
            "routing": RoutingConfig,
            "timeouts": TimeoutConfig,
            "store": StoreConfig,
            "scrape": ScrapeConfig,
            "stats": StatsConfig,
            "warmup": WarmupConfig,
            "baseline": ArmConfig,
            "speculative": ArmConfig,
            "outlier": OutlierConfig,
            "control": ControlConfig,
            "telemetry": TelemetryConfig,
            "segments": SegmentsConfig,
            "ramp": RampConfig,
        }
        top: dict[str, Any] = {}
        moved = moved_settings(data)
        mixed = [key for key in _SHORTHAND_KEYS if key in moved]
        if "arms" in moved and mixed:
            raise ConfigError(
                f"arms cannot be mixed with the two-arm shorthand ({', '.join(mixed)}): give"
                " every arm as an [arms.NAME] table"
            )
        routing = moved.get("routing")
        if "arms" in moved and isinstance(routing, Mapping) and "speculative_share" in routing:
            raise ConfigError(
                "arms cannot be mixed with the two-arm shorthand (routing.speculative_share):"
                " give each arm's weight in its [arms.NAME] table"
            )
        for key, value in moved.items():
            if key == "arms":
                if not isinstance(value, Mapping):
                    raise ConfigError("[arms] must be a table of [arms.NAME] tables")
                top[key] = {
                    name: arm if isinstance(arm, Mapping) else _not_table(f"arms.{name}")
                    for name, arm in value.items()
                }
            elif key in sections:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"[{key}] must be a table")
                if sections[key] is ArmConfig:
                    value = {**value, "name": key}
                top[key] = _build(sections[key], value, prefix=f"{key}.")
            else:
                top[key] = value
        return _build(cls, top, prefix="")

    def to_mapping(self) -> dict[str, Any]:
        """Plain JSON-able data that `from_mapping` turns back into an equal `Config` (how
        `specproxy serve` hands its merged settings to its stats process)."""
        data = dataclasses.asdict(self)
        if self.shorthand:
            del data["arms"]  # built from the shorthand, which says it all
            for arm in _SHORTHAND_ARMS:
                del data[f"{arm}_url"]  # the shorthand of the arm's table, which says it all
                for key in ("name", "role", "weight", "labels", "timeouts"):
                    del data[arm][key]  # set by from_mapping from the shorthand's own keys
            return data
        for key in _SHORTHAND_KEYS:
            del data[key]
        del data["routing"]["speculative_share"]
        del data["timeouts"]["speculative"], data["timeouts"]["baseline"]
        for arm in data["arms"].values():
            del arm["name"]  # the table's key
        return data

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> Config:
        """Load a TOML file; `overrides` (top-level keys) win over the file."""
        data = load_toml(path)
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(data)


_T = TypeVar("_T")

# Settings that moved: (table, key) -> (new table, new key), or None where the setting is gone
# (it chose an algorithm the code now fixes). Files and variables that still set them keep
# working, with a warning naming the new place.
MOVED: Final[dict[tuple[str, str], tuple[str, str] | None]] = {
    ("stats", "warmup_requests"): ("warmup", "requests"),
    ("scrape", "warmup_requests"): ("warmup", "restart_requests"),
    ("scrape", "warmup_seconds"): ("warmup", "restart_seconds"),
    ("stats", "raw_rows_max"): None,
    ("store", "rollup_fine_minutes"): None,  # summary.tiering.FINE_MINUTES
    ("store", "rollup_minute_hours"): None,  # summary.tiering.MINUTE_HOURS
}


def moved_settings(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with settings that moved put in their new place (`MOVED`), each with a warning."""
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in data.items()}
    for (table, key), target in MOVED.items():
        section = out.get(table)
        if not isinstance(section, dict) or key not in section:
            continue
        value = section.pop(key)
        if target is None:
            log.warning("config: %s.%s is no longer a setting; ignored", table, key)
            continue
        new_table, new_key = target
        dest = out.setdefault(new_table, {})
        if isinstance(dest, dict):
            dest.setdefault(new_key, value)
        log.warning("config: %s.%s moved to [%s] %s", table, key, new_table, new_key)
    return out


def load_toml(path: str | Path) -> dict[str, Any]:
    """The parsed config file, unvalidated; every problem reading it is a `ConfigError`."""
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def section(cls: type[_T], data: object, name: str) -> _T:
    """One table (`[name]`) on its own, validated as `Config.from_mapping` validates it: for a
    command that needs the store or the statistics settings but not the arms."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"[{name}] must be a table")
    return _build(cls, data, prefix=f"{name}.")


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`" (did you mean X?)"` for the closest candidate to a misspelt name, else `""`."""
    close = difflib.get_close_matches(word, list(candidates), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def _build(cls: type[_T], data: Mapping[str, Any], *, prefix: str) -> _T:
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        names = [
            prefix + k + did_you_mean(prefix + k, [prefix + c for c in known]) for k in unknown
        ]
        raise ConfigError(f"unknown setting(s): {', '.join(names)}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "windows_s":
            value = _windows(value, prefix + key)
        f = known[key]
        default = f.default if f.default is not dataclasses.MISSING else None
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{prefix}{key} must be true or false, got {value!r}")
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        wants_number = numeric or f.type in ("float", "int", "float | None", "int | None")
        not_number = isinstance(value, bool) or not isinstance(value, (int, float))
        if wants_number and value is not None and not_number:
            raise ConfigError(f"{prefix}{key} must be a number, got {value!r}")
        if f.type in ("int", "int | None") and isinstance(value, float):
            raise ConfigError(f"{prefix}{key} must be a whole number, got {value!r}")
        if isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(f"{prefix}{key} must be a string, got {value!r}")
        values[key] = value
    try:
        return cls(**values)
    except TypeError as exc:
        if "required" in str(exc) or "missing" in str(exc):
            raise ConfigError(f"missing setting(s) in {prefix or 'config'}: {exc}") from exc
        raise ConfigError(f"invalid setting in {prefix or 'config'}: {exc}") from exc


def _windows(value: object, name: str) -> object:
    """`stats.windows_s` as the tuple `StatsConfig` takes: seconds, or None for "all"/"run"."""
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise ConfigError(f'{name} must be a list of seconds or "all", got {value!r}')
    out: list[float | None] = []
    for w in value:
        if w is None or w in ("all", "run"):
            out.append(None)
        elif isinstance(w, (int, float)) and not isinstance(w, bool):
            out.append(w)
        else:
            raise ConfigError(f'{name} entries must be seconds or "all", got {w!r}')
    return tuple(out)


_SHORTHAND_ARMS: Final = (SHORTHAND_CONTROL, SHORTHAND_TREATMENT)
_ROLES: Final = {SHORTHAND_CONTROL: "control", SHORTHAND_TREATMENT: "treatment"}


def _not_table(name: str) -> Any:
    raise ConfigError(f"[{name}] must be a table")


def _arm_labels(labels: object, name: str) -> dict[str, str]:
    """An arm's labels as {key: string}: bounded in number, key and value (TOML numbers and
    booleans, such as `k = 4`, become their text)."""
    _check(isinstance(labels, Mapping), name, "must be a table of key = value")
    assert isinstance(labels, Mapping)
    _check(len(labels) <= ARM_LABELS_MAX, name, f"must have at most {ARM_LABELS_MAX} labels")
    out: dict[str, str] = {}
    for key, value in labels.items():
        _check(
            _is_str(key) and ARM_LABEL_KEY_PATTERN.fullmatch(key) is not None,
            name,
            f"key {str(key)[:40]!r} must be a lower-case identifier of at most 32 characters",
        )
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (int, float)):
            value = f"{value:g}" if isinstance(value, float) else str(value)
        _check(
            _is_str(value) and len(value) <= ARM_LABEL_VALUE_MAX_CHARS and value.isprintable(),
            f"{name}.{key}",
            f"must be printable text of at most {ARM_LABEL_VALUE_MAX_CHARS} characters",
        )
        out[key] = value
    return out


def _is_str(value: object) -> bool:
    """Runtime check of data parsed from TOML, whose static type cannot be trusted."""
    return isinstance(value, str)


def _is_http_url(url: str) -> bool:
    """An absolute http(s) URL with a host and, if any, a numeric port in range: one URL, so a
    comma-separated list (which urlsplit reads as one odd host) is refused at start-up."""
    if any(c in url for c in ", \t\r\n"):
        return False
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    try:
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        return False
    return True


def _one_url_hint(url: str, arm: str) -> str:
    """What to say about a rejected URL that is really a list of them."""
    if "," in url:
        return f'; one URL here: several endpoints go in a [{arm}] table, urls = ["...", "..."]'
    return ""


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{name} {message}")
