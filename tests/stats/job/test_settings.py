"""Where a stats process's settings come from (`stats.job.settings`)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from specproxy.config import Config, StatsConfig, WarmupConfig
from specproxy.errors import ConfigError
from specproxy.stats.job.settings import (
    CHILD_CONFIG_ENV,
    arm_roles,
    child_settings,
    command_settings,
)
from specproxy.stats.job.tick import configs_of


def test_stored_settings_win_and_what_a_result_lacks_keeps_its_value() -> None:
    stored = {
        "settings": {"p99_tolerance": 0.0, "alpha": 0.01, "restart_warmup_seconds": 5.0},
        # an older result without settings.windows_s: PostgreSQL's JSONB returns the windows
        # in its own key order
        "results": {"all": {"all": {"window_s": None}, "1h": {"window_s": 3600.0},
                            "5m": {"window_s": 300.0}}},
    }  # fmt: skip
    stats, warmup = configs_of(stored, StatsConfig(resamples=500), WarmupConfig())
    assert (stats.p99_tolerance, stats.alpha, stats.resamples) == (0.0, 0.01, 500)
    assert stats.windows_s == (300.0, 3600.0, None)  # shortest first, the whole run last
    assert warmup.restart_seconds == 5.0 and warmup.requests == WarmupConfig().requests
    with pytest.raises(ConfigError, match=r"stats\.alpha"):  # a stored value is validated too
        configs_of({"settings": {"alpha": 0.7}}, StatsConfig(), WarmupConfig())
    with pytest.raises(ConfigError, match="malformed"):
        configs_of({"settings": {"warmup_requests": "x"}}, StatsConfig(), WarmupConfig())


def test_a_command_reads_moved_settings_from_their_old_place() -> None:
    env = {"SPECPROXY_STATS__WARMUP_REQUESTS": "3", "SPECPROXY_SCRAPE__WARMUP_SECONDS": "2"}
    settings = command_settings(None, environ=env)
    assert settings.warmup == WarmupConfig(requests=3, restart_seconds=2.0)


def test_a_command_needs_no_arms_but_validates_what_it_is_given(tmp_path: Path) -> None:
    settings = command_settings(None, store_url="sqlite:///x.db", environ={})
    assert settings.config is None and settings.run_id is None
    assert settings.store.url == "sqlite:///x.db"
    env = {"SPECPROXY_STATS__P99_TOLERANCE": "0", "SPECPROXY_RUN_ID": "r9"}
    from_env = command_settings(None, environ=env)
    assert from_env.stats.p99_tolerance == 0.0 and from_env.run_id == "r9"
    with pytest.raises(ConfigError, match=r"stats\.alpah"):
        path = tmp_path / "c.toml"
        path.write_text("[stats]\nalpah = 0.1\n")
        command_settings(str(path), environ={})
    arms = tmp_path / "arms.toml"
    arms.write_text('baseline_url = "http://b:1"\nspeculative_url = "http://s:2"\n')
    whole = command_settings(str(arms), environ={})
    assert whole.config is not None and whole.run_id == "default"  # a proxy's config, whole


def test_the_child_reads_the_config_its_parent_handed_over() -> None:
    cfg = Config(baseline_url="http://b:1", speculative_url="http://s:2", run_id="r")
    settings = child_settings({CHILD_CONFIG_ENV: json.dumps(cfg.to_mapping())})
    assert settings.config == cfg and settings.run_id == "r"
    with pytest.raises(ConfigError, match="only serve starts"):
        child_settings({})
    with pytest.raises(ConfigError, match="not JSON"):
        child_settings({CHILD_CONFIG_ENV: "{"})


def test_the_arms_come_from_control_given_else_the_config() -> None:
    """`specproxy stats --follow --control NAME` without a config: the control named, every
    other arm of the data a treatment; a config's arms otherwise; neither: the shorthand."""
    cfg = Config.from_mapping(
        {
            "arms": {
                "base": {"role": "control", "urls": ["http://a:1"]},
                "k2": {"urls": ["http://b:1"]},
                "k4": {"urls": ["http://c:1"]},
            }
        }
    )
    bare = command_settings(None, environ={})
    assert arm_roles(bare) == {}
    with_config = dataclasses.replace(bare, config=cfg)
    assert arm_roles(with_config) == {"control": "base", "treatments": ("k2", "k4")}
    assert arm_roles(dataclasses.replace(with_config, control="k2")) == {"control": "k2"}
