"""Which settings a statistics process computes with, and where each comes from.

`specproxy stats` reads the same TOML as `specproxy serve` (`--config`) and the same `SPECPROXY_*`
variables; the stats process that serve starts gets serve's merged, validated `Config` instead,
as JSON in `CHILD_CONFIG_ENV` (no file that could outlive it). The arms are optional here: a
process that only analyses a store needs the store, the run and the `[stats]`/`[scrape]` tables.

A one-off analysis reproduces what the proxy said live: by default it takes the settings stored
with the run's latest result (`result["settings"]`: tolerance, alpha, confidence, resamples,
seed, warm-up, and the windows it compared), over the config's; `stored_settings` reads them.
Flags win over both.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specproxy.config import Config, ScrapeConfig, StatsConfig, StoreConfig, load_toml, section
from specproxy.config_env import file_and_env
from specproxy.errors import ConfigError

__all__ = [
    "CHILD_CONFIG_ENV",
    "StatsSettings",
    "child_settings",
    "command_settings",
    "stored_settings",
]

# The stats process serve starts reads serve's whole config from this variable (JSON).
CHILD_CONFIG_ENV = "SPECPROXY_STATS_CHILD_CONFIG"


@dataclass(frozen=True, slots=True)
class StatsSettings:
    """What a stats process needs; `config` is the whole proxy config when the arms are known
    (the `--follow` process asks them which models they serve, for the bounded model label)."""

    store: StoreConfig
    stats: StatsConfig
    scrape: ScrapeConfig
    run_id: str | None  # None: the store's only run, else "default"
    config: Config | None = None

    def replace_stats(self, **changes: Any) -> StatsSettings:
        """With `[stats]` settings changed (validated again)."""
        return dataclasses.replace(self, stats=dataclasses.replace(self.stats, **changes))


def child_settings(environ: Mapping[str, str] | None = None) -> StatsSettings:
    """The settings serve handed to its stats process (`CHILD_CONFIG_ENV`)."""
    env = os.environ if environ is None else environ
    raw = env.get(CHILD_CONFIG_ENV)
    if raw is None:
        raise ConfigError(f"{CHILD_CONFIG_ENV} is not set: only serve starts a stats child")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{CHILD_CONFIG_ENV} is not JSON: {exc}") from exc
    return _from_config(Config.from_mapping(data))


def command_settings(
    config_path: str | None,
    *,
    store_url: str | None = None,
    run_id: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> StatsSettings:
    """The config file (if any) under the `SPECPROXY_*` environment under the flags given."""
    data = load_toml(config_path) if config_path else {}
    data, _ = file_and_env(data, os.environ if environ is None else environ)
    if store_url is not None:
        store = data.setdefault("store", {})
        if not isinstance(store, dict):
            raise ConfigError("[store] must be a table")
        store["url"] = store_url
    if run_id is not None:
        data["run_id"] = run_id
    if any(key in data for key in ("baseline_url", "speculative_url", "baseline", "speculative")):
        return _from_config(Config.from_mapping(data))  # a proxy's config: validated whole
    run = data.get("run_id")
    if run is not None and not (isinstance(run, str) and run.strip()):
        raise ConfigError("run_id must be a non-empty string")
    return StatsSettings(
        store=section(StoreConfig, data.get("store", {}), "store"),
        stats=section(StatsConfig, data.get("stats", {}), "stats"),
        scrape=section(ScrapeConfig, data.get("scrape", {}), "scrape"),
        run_id=run,
    )


def _from_config(cfg: Config) -> StatsSettings:
    return StatsSettings(cfg.store, cfg.stats, cfg.scrape, cfg.run_id, cfg)


def stored_settings(
    result: Mapping[str, Any], stats: StatsConfig, scrape: ScrapeConfig
) -> tuple[StatsConfig, ScrapeConfig]:
    """`stats` and `scrape` with what a stored result says it was computed with (a key the
    result lacks, as in results of older versions, keeps the given value)."""
    stored = result.get("settings") or {}
    fields = ("resamples", "confidence", "alpha", "p99_tolerance", "warmup_requests", "seed")
    changes: dict[str, Any] = {k: stored[k] for k in (*fields, "raw_rows_max") if k in stored}
    windows = (result.get("results") or {}).get("all")
    if isinstance(windows, Mapping) and windows:
        # shortest first, the whole run last: PostgreSQL's JSONB keeps no key order
        lengths = {w.get("window_s") for w in windows.values()}
        changes["windows_s"] = tuple(sorted(lengths, key=lambda w: (w is None, w or 0.0)))
    restart = {
        name: stored[key]
        for name, key in (
            ("warmup_requests", "restart_warmup_requests"),
            ("warmup_seconds", "restart_warmup_seconds"),
        )
        if key in stored
    }
    return dataclasses.replace(stats, **changes), dataclasses.replace(scrape, **restart)
