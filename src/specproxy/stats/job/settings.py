"""Which settings a statistics process computes with, and where each comes from.

`specproxy stats` reads the same TOML as `specproxy serve` (`--config`) and the same `SPECPROXY_*`
variables; the stats process that serve starts gets serve's merged, validated `Config` instead,
as JSON in `CHILD_CONFIG_ENV` (no file that could outlive it). The arms are optional here: a
process that only analyses a store needs the store, the run and the `[stats]`, `[warmup]` and
`[scrape]` tables.

A one-off analysis reproduces what the proxy said live: by default it takes the settings stored
with the run's latest result (`result["settings"]`: tolerance, alpha, confidence, resamples,
seed, warm-up, and the windows it compared), over the config's (`stats.job.tick.configs_of`).
Flags win over both.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specproxy.config import (
    Config,
    ScrapeConfig,
    StatsConfig,
    StoreConfig,
    WarmupConfig,
    load_toml,
    moved_settings,
    section,
)
from specproxy.config_env import file_and_env
from specproxy.errors import ConfigError
from specproxy.stats.job.horizon import horizon_s

__all__ = [
    "CHILD_CONFIG_ENV",
    "StatsSettings",
    "arm_roles",
    "child_settings",
    "command_settings",
]

# The stats process serve starts reads serve's whole config from this variable (JSON).
CHILD_CONFIG_ENV = "SPECPROXY_STATS_CHILD_CONFIG"


@dataclass(frozen=True, slots=True)
class StatsSettings:
    """What a stats process needs; `config` is the whole proxy config when the arms are known
    (the `--follow` process asks them which models they serve, for the bounded model label)."""

    store: StoreConfig
    stats: StatsConfig
    warmup: WarmupConfig
    scrape: ScrapeConfig
    run_id: str | None  # None: the store's only run, else "default"
    config: Config | None = None
    control: str | None = None  # `--control NAME`: the control arm, over the config's


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
    data = moved_settings(data)
    if store_url is not None:
        store = data.setdefault("store", {})
        if not isinstance(store, dict):
            raise ConfigError("[store] must be a table")
        store["url"] = store_url
    if run_id is not None:
        data["run_id"] = run_id
    if any(
        key in data
        for key in ("baseline_url", "speculative_url", "baseline", "speculative", "arms")
    ):
        return _from_config(Config.from_mapping(data))  # a proxy's config: validated whole
    run = data.get("run_id")
    if run is not None and not (isinstance(run, str) and run.strip()):
        raise ConfigError("run_id must be a non-empty string")
    return StatsSettings(
        store=section(StoreConfig, data.get("store", {}), "store"),
        stats=section(StatsConfig, data.get("stats", {}), "stats"),
        warmup=section(WarmupConfig, data.get("warmup", {}), "warmup"),
        scrape=section(ScrapeConfig, data.get("scrape", {}), "scrape"),
        run_id=run,
    )


def _from_config(cfg: Config) -> StatsSettings:
    return StatsSettings(cfg.store, cfg.stats, cfg.warmup, cfg.scrape, cfg.run_id, cfg)


def arm_roles(settings: StatsSettings) -> dict[str, Any]:
    """`StatsJob`'s (and `compute_stats`') `control`, `treatments` and `labels`: a `--control`
    given (every other arm in the data a treatment), else the proxy config's arms; {} with
    neither (the shorthand's control, every other arm in the data a treatment). The config's
    arm labels go with either."""
    config = settings.config
    roles: dict[str, Any] = {}
    if config is not None:
        roles = {"control": config.control_arm, "treatments": config.treatment_arms}
        if config.arm_labels:
            roles["labels"] = config.arm_labels
    if settings.control is not None:
        roles["control"] = settings.control
        roles.pop("treatments", None)
    return roles


def ramp_of(config: Config | None) -> dict[str, Any]:
    """`StatsJob`'s `ramp`, `ramp_weights` and `ramp_horizon_s` from a proxy config: each
    ramped arm (`ramp.arms`, or every treatment) with its configured weight, and the longest a
    request of the control or a ramped arm can last (`stats.job.horizon.horizon_s`); {} when
    `[ramp]` is off."""
    if config is None or not config.ramp.enabled:
        return {}
    arms = config.ramp.arms or tuple(config.treatment_arms)
    weights = {arm: config.arm_config(arm).weight for arm in arms}
    longest = [config.arm_timeouts(arm).longest_s() for arm in (config.control_arm, *arms)]
    return {"ramp": config.ramp, "ramp_weights": weights, "ramp_horizon_s": horizon_s(longest)}
