"""One typed, validated configuration object for every part of specproxy.

`Config` is built once at start-up, from a TOML file (`Config.from_toml`), a mapping
(`Config.from_mapping`, which the CLI uses after merging its flags), or keyword arguments in tests.
Every problem is a `ConfigError` that names the setting, so a bad config fails before the proxy
accepts its first request. The TOML file mirrors the dataclasses: top-level keys plus the tables
`[routing]`, `[timeouts]`, `[store]`, `[scrape]` and `[stats]`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args
from urllib.parse import urlsplit

from specproxy.errors import ConfigError

__all__ = [
    "Config",
    "RoutingConfig",
    "ScrapeConfig",
    "StatsConfig",
    "StoreConfig",
    "TimeoutConfig",
]

RoutingMode = Literal["weighted", "sticky"]
StickySource = Literal["header", "user"]


@dataclass(frozen=True, slots=True)
class RoutingConfig:
    """How requests are split between the arms."""

    mode: RoutingMode = "weighted"
    speculative_share: float = 0.5  # probability (weighted) or key-space share (sticky)
    sticky_source: StickySource = "header"
    sticky_header: str = "x-session-id"
    allow_forced_arm: bool = False  # honour the `x-specproxy-arm` request header
    mirror_fraction: float = 0.0  # share of requests also sent to the other arm as a shadow
    max_concurrent_shadows: int = 8  # shadows beyond this are skipped, never queued
    seed: int | None = None  # seed of the routing RNG (tests, reproducible demos)

    def validate(self) -> None:
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


@dataclass(frozen=True, slots=True)
class TimeoutConfig:
    """Upstream timeouts. There is deliberately no total timeout: long generations are legal."""

    connect_s: float = 5.0
    read_s: float = 600.0  # longest silence between two upstream bytes

    def validate(self) -> None:
        _check(self.connect_s > 0, "timeouts.connect_s", "must be > 0")
        _check(self.read_s > 0, "timeouts.read_s", "must be > 0")


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where per-request records go."""

    url: str = "sqlite:///specproxy.db"
    flush_interval_s: float = 0.5
    batch_size: int = 2000
    max_buffer: int = 200_000  # records held in memory before spilling to `spill_path`
    spill_path: str = "specproxy-spill.jsonl"
    retention_days: float | None = None  # None keeps everything

    def validate(self) -> None:
        scheme = urlsplit(self.url).scheme
        _check(
            scheme in ("sqlite", "postgresql", "postgres", "memory"),
            "store.url",
            f"scheme {scheme!r} is not one of sqlite://, postgresql://, memory://",
        )
        _check(0 < self.flush_interval_s <= 1.0, "store.flush_interval_s", "must be in (0, 1]")
        _check(self.batch_size > 0, "store.batch_size", "must be > 0")
        _check(self.max_buffer > 0, "store.max_buffer", "must be > 0")
        _check(
            self.retention_days is None or self.retention_days > 0,
            "store.retention_days",
            "must be > 0",
        )


@dataclass(frozen=True, slots=True)
class ScrapeConfig:
    """Polling of each arm's /metrics."""

    interval_s: float = 5.0
    timeout_s: float = 3.0
    warmup_requests: int = 20  # requests excluded after an engine restart
    warmup_seconds: float = 30.0  # seconds excluded after an engine restart

    def validate(self) -> None:
        _check(self.interval_s > 0, "scrape.interval_s", "must be > 0")
        _check(self.timeout_s > 0, "scrape.timeout_s", "must be > 0")
        _check(self.warmup_requests >= 0, "scrape.warmup_requests", "must be >= 0")
        _check(self.warmup_seconds >= 0, "scrape.warmup_seconds", "must be >= 0")


@dataclass(frozen=True, slots=True)
class StatsConfig:
    """The periodic comparison job."""

    interval_s: float = 15.0
    windows_s: tuple[float | None, ...] = (300.0, 3600.0, None)  # None = the whole run
    resamples: int = 2000
    confidence: float = 0.95
    alpha: float = 0.05  # error rate of the anytime-valid tests
    p99_tolerance: float = 0.05  # "slower" means spec P99 > baseline P99 * (1 + tolerance)
    warmup_requests: int = 20  # first requests per arm excluded after start
    seed: int = 0

    def validate(self) -> None:
        _check(self.interval_s > 0, "stats.interval_s", "must be > 0")
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
        _check(self.warmup_requests >= 0, "stats.warmup_requests", "must be >= 0")


@dataclass(frozen=True, slots=True)
class Config:
    """Everything the proxy needs. Upstreams come only from here: the proxy is never open."""

    baseline_url: str
    speculative_url: str
    host: str = "127.0.0.1"
    port: int = 8000
    run_id: str = "default"
    inject_usage: bool = True  # ask upstream for the usage chunk, strip it if the client didn't
    max_body_bytes: int = 32 * 1024 * 1024
    routing: RoutingConfig = field(default_factory=RoutingConfig)
    timeouts: TimeoutConfig = field(default_factory=TimeoutConfig)
    store: StoreConfig = field(default_factory=StoreConfig)
    scrape: ScrapeConfig = field(default_factory=ScrapeConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)

    def __post_init__(self) -> None:
        for name in ("baseline_url", "speculative_url"):
            parts = urlsplit(getattr(self, name))
            _check(
                parts.scheme in ("http", "https") and bool(parts.netloc),
                name,
                f"must be an absolute http(s) URL, got {getattr(self, name)!r}",
            )
        _check(0 <= self.port <= 65535, "port", "must be in [0, 65535]")
        _check(bool(self.run_id.strip()), "run_id", "must not be empty")
        _check(self.max_body_bytes > 0, "max_body_bytes", "must be > 0")
        for section in (self.routing, self.timeouts, self.store, self.scrape, self.stats):
            section.validate()

    def upstream_url(self, arm: str) -> str:
        """The base URL of an arm, without a trailing slash."""
        url = self.speculative_url if arm == "speculative" else self.baseline_url
        return url.rstrip("/")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> Config:
        """Build from plain data (parsed TOML, merged CLI flags); unknown keys are errors."""
        sections: dict[str, type[Any]] = {
            "routing": RoutingConfig,
            "timeouts": TimeoutConfig,
            "store": StoreConfig,
            "scrape": ScrapeConfig,
            "stats": StatsConfig,
        }
        top: dict[str, Any] = {}
        for key, value in data.items():
            if key in sections:
                if not isinstance(value, Mapping):
                    raise ConfigError(f"[{key}] must be a table")
                top[key] = _build(sections[key], value, prefix=f"{key}.")
            else:
                top[key] = value
        return _build(cls, top, prefix="")

    @classmethod
    def from_toml(cls, path: str | Path, **overrides: Any) -> Config:
        """Load a TOML file; `overrides` (top-level keys) win over the file."""
        try:
            with open(path, "rb") as fh:
                data = tomllib.load(fh)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path}: {exc.strerror}") from exc
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc
        data.update({k: v for k, v in overrides.items() if v is not None})
        return cls.from_mapping(data)


_T = TypeVar("_T")


def _build(cls: type[_T], data: Mapping[str, Any], *, prefix: str) -> _T:
    known = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ConfigError(f"unknown setting(s): {', '.join(prefix + k for k in unknown)}")
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "windows_s" and isinstance(value, list):
            value = tuple(None if (w is None or w in ("all", "run")) else w for w in value)
        f = known[key]
        default = f.default if f.default is not dataclasses.MISSING else None
        if isinstance(default, bool) and not isinstance(value, bool):
            raise ConfigError(f"{prefix}{key} must be true or false, got {value!r}")
        numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
        wants_number = numeric or f.type in ("float", "int", "float | None", "int | None")
        not_number = isinstance(value, bool) or not isinstance(value, (int, float))
        if wants_number and value is not None and not_number:
            raise ConfigError(f"{prefix}{key} must be a number, got {value!r}")
        if isinstance(default, str) and not isinstance(value, str):
            raise ConfigError(f"{prefix}{key} must be a string, got {value!r}")
        values[key] = value
    try:
        return cls(**values)
    except TypeError as exc:
        raise ConfigError(f"missing setting(s) in {prefix or 'config'}: {exc}") from exc


def _check(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(f"{name} {message}")
