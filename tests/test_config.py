from __future__ import annotations

from pathlib import Path

import pytest

from specproxy.config import Config
from specproxy.errors import ConfigError

ARMS: dict[str, str] = {
    "baseline_url": "http://127.0.0.1:9001",
    "speculative_url": "http://127.0.0.1:9002",
}


def test_defaults_are_valid() -> None:
    cfg = Config(baseline_url=ARMS["baseline_url"], speculative_url=ARMS["speculative_url"])
    assert cfg.routing.speculative_share == 0.5
    assert cfg.upstream_url("speculative") == "http://127.0.0.1:9002"


def test_toml_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'baseline_url = "http://127.0.0.1:1/"\nspeculative_url = "http://127.0.0.1:2"\n'
        '[routing]\nmode = "sticky"\nspeculative_share = 0.25\n'
        '[stats]\nwindows_s = [300, "all"]\n'
    )
    cfg = Config.from_toml(path)
    assert (cfg.routing.mode, cfg.routing.speculative_share) == ("sticky", 0.25)
    assert list(cfg.stats.windows_s) == [300, None]
    assert cfg.upstream_url("baseline") == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"speculative_url": "not-a-url"}, "speculative_url"),
        ({"routing": {"speculative_share": 1.5}}, "routing.speculative_share"),
        ({"routing": {"speculative_share": "x"}}, "must be a number"),
        ({"routing": {"mode": "random"}}, "routing.mode"),
        ({"store": {"url": "mysql://x"}}, "store.url"),
        ({"stats": {"confidence": 2}}, "stats.confidence"),
        ({"bogus": 1}, "unknown setting"),
        ({"routing": {"allow_forced_arm": "yes"}}, "true or false"),
        ({"routing": 3}, "must be a table"),
    ],
)
def test_bad_config_names_the_setting(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config.from_mapping({**ARMS, **data})


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        Config.from_toml(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("baseline_url = ")
    with pytest.raises(ConfigError, match="not valid TOML"):
        Config.from_toml(bad)
