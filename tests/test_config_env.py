"""`SPECPROXY_*` environment variables: the naming rule, parsing by type, errors naming the
variable, and their place between the config file and the flags."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from specproxy import serve
from specproxy.config import Config
from specproxy.config_env import NOT_SETTINGS, env_settings, setting_fields, variable_name
from specproxy.errors import ConfigError

ARMS = {"SPECPROXY_BASELINE_URL": "http://b:1", "SPECPROXY_SPECULATIVE_URL": "http://s:2"}


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    return parser.parse_args(list(argv))


def test_the_naming_rule() -> None:
    assert variable_name(None, "baseline_url") == "SPECPROXY_BASELINE_URL"
    assert variable_name("store", "url") == "SPECPROXY_STORE__URL"
    assert variable_name("routing", "speculative_share") == "SPECPROXY_ROUTING__SPECULATIVE_SHARE"


def test_every_setting_of_config_has_a_variable() -> None:
    tables = setting_fields()
    sections = {f.name for f in dataclasses.fields(Config) if f.name in tables}
    assert sections >= {"routing", "timeouts", "store", "scrape", "stats"}
    top = {f.name for f in dataclasses.fields(Config)} - sections
    assert set(tables[None]) == top
    for section in sections:
        nested = getattr(Config(baseline_url="http://b", speculative_url="http://s"), section)
        assert set(tables[section]) == {f.name for f in dataclasses.fields(nested)}


def test_values_parse_by_the_settings_type() -> None:
    data, sources = env_settings(
        {
            **ARMS,
            "SPECPROXY_PORT": "9000",
            "SPECPROXY_INJECT_USAGE": "false",
            "SPECPROXY_RUN_ID": "1234",  # a string setting stays a string
            "SPECPROXY_ROUTING__MODE": "sticky",
            "SPECPROXY_ROUTING__SPECULATIVE_SHARE": "0.25",
            "SPECPROXY_ROUTING__SEED": "",  # empty unsets an optional setting
            "SPECPROXY_STORE__URL": "postgresql://u:p@db/specproxy",
            "SPECPROXY_STATS__WINDOWS_S": '[300, 3600, "all"]',
            "SPECPROXY_VLLM_PYTHON": "/not/a/setting",  # other tooling's variable: left alone
            "HOME": "/root",
        }
    )
    assert data == {
        "baseline_url": "http://b:1",
        "speculative_url": "http://s:2",
        "port": 9000,
        "inject_usage": False,
        "run_id": "1234",
        "routing": {"mode": "sticky", "speculative_share": 0.25, "seed": None},
        "store": {"url": "postgresql://u:p@db/specproxy"},
        "stats": {"windows_s": [300, 3600, "all"]},
    }
    assert sources["store.url"] == "SPECPROXY_STORE__URL"
    cfg = Config.from_mapping(data)
    assert cfg.stats.windows_s == (300.0, 3600.0, None)
    assert cfg.routing.speculative_share == 0.25 and cfg.port == 9000


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SPECPROXY_STROE__URL": "x"}, r"STROE__URL is not .*did you mean SPECPROXY_STORE__URL"),
        ({"SPECPROXY_STORE__ULR": "x"}, r"STORE__ULR is not .*did you mean SPECPROXY_STORE__URL"),
        ({"SPECPROXY_PORT": "eighty"}, r"SPECPROXY_PORT='eighty' is not a TOML value"),
    ],
)  # fmt: skip
def test_bad_variables_are_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        env_settings(environ)


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SPECPROXY_ROUTING__MIRROR_FRACTION": "2"}, r"mirror_fraction .*by SPECPROXY_ROUTING"),
        ({"SPECPROXY_STORE__URL": "ftp://x"}, r"store.url .*\(set by SPECPROXY_STORE__URL\)"),
        ({"SPECPROXY_PORT": "true"}, r"port must be a number.*\(set by SPECPROXY_PORT\)"),
    ],
)  # fmt: skip
def test_invalid_values_from_the_environment_name_their_variable(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        serve.build_config(parse(), environ={**ARMS, **environ})


def test_precedence_flags_over_environment_over_file_over_defaults(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(
        'baseline_url = "http://file-b:1"\nspeculative_url = "http://file-s:2"\nport = 9000\n'
        'run_id = "file"\n[store]\nurl = "sqlite:///file.db"\nbatch_size = 10\n'
    )
    environ = {
        "SPECPROXY_BASELINE_URL": "http://env-b:1",
        "SPECPROXY_RUN_ID": "env",
        "SPECPROXY_STORE__URL": "postgresql://env/db",
    }
    cfg = serve.build_config(parse("--config", str(path), "--run-id", "flag"), environ=environ)
    assert cfg.run_id == "flag"  # flag > env > file
    assert cfg.baseline_url == "http://env-b:1"  # env > file
    assert cfg.store.url == "postgresql://env/db"  # env > file, inside a section...
    assert cfg.store.batch_size == 10  # ...without dropping the file's other keys there
    assert cfg.speculative_url == "http://file-s:2" and cfg.port == 9000  # file > defaults
    assert cfg.scrape.interval_s == Config.from_mapping(ARMS_DATA).scrape.interval_s  # defaults


def test_a_flag_that_overrides_a_variable_is_blamed_itself() -> None:
    environ = {**ARMS, "SPECPROXY_ROUTING__SPECULATIVE_SHARE": "0.5"}
    with pytest.raises(ConfigError) as caught:
        serve.build_config(parse("--share", "3"), environ=environ)
    assert "SPECPROXY_" not in str(caught.value)


def test_missing_arm_names_the_variable_too() -> None:
    with pytest.raises(ConfigError, match="SPECPROXY_BASELINE_URL"):
        serve.build_config(parse(), environ={"SPECPROXY_SPECULATIVE_URL": "http://s"})


ARMS_DATA = {"baseline_url": "http://b", "speculative_url": "http://s"}


def test_an_arm_pool_from_the_environment() -> None:
    environ = {
        "SPECPROXY_BASELINE__URLS": '["http://b1:8000", "http://b2:8000"]',
        "SPECPROXY_SPECULATIVE__DNS": "vllm-spec.llm.svc.cluster.local",
        "SPECPROXY_SPECULATIVE__PORT": "8001",
    }
    cfg = serve.build_config(parse(), environ=environ)
    assert cfg.arm_config("baseline").urls == ("http://b1:8000", "http://b2:8000")
    assert cfg.arm_config("speculative").dns == "vllm-spec.llm.svc.cluster.local"
    assert cfg.arm_config("speculative").port == 8001


def test_gpu_telemetry_urls_from_the_environment() -> None:
    environ = {
        "SPECPROXY_SPECULATIVE__URLS": '["http://s1:8000"]',
        "SPECPROXY_SPECULATIVE__DCGM_URLS": '["http://gpu-node-1:9400"]',
        "SPECPROXY_SPECULATIVE__DCGM_GPUS": '["0", "1"]',
        "SPECPROXY_BASELINE__URLS": '["http://b1:8000"]',
    }
    cfg = serve.build_config(parse(), environ=environ)
    assert cfg.arm_config("speculative").dcgm_urls == ("http://gpu-node-1:9400",)
    assert cfg.arm_config("speculative").dcgm_gpus == ("0", "1")
    assert cfg.arm_config("baseline").dcgm_urls == ()


def test_a_nested_table_is_an_inline_toml_table() -> None:
    environ = {**ARMS, "SPECPROXY_TIMEOUTS__SPECULATIVE": "{read_s = 30}"}
    cfg = serve.build_config(parse(), environ=environ)
    assert cfg.timeouts.for_arm("speculative").read_s == 30
    with pytest.raises(ConfigError, match=r"SPECPROXY_TIMEOUTS__SPECULATIVE='\{read_s = \.\.\.\}'"):
        env_settings({"SPECPROXY_TIMEOUTS__SPECULATIVE__READ_S": "30"})


def test_on_down_from_the_environment_beside_the_shorthand_url() -> None:
    cfg = serve.build_config(parse(), environ={**ARMS, "SPECPROXY_SPECULATIVE__ON_DOWN": "error"})
    speculative = cfg.arm_config("speculative")
    assert speculative.on_down == "error" and speculative.urls == ("http://s:2",)
    assert cfg.arm_config("baseline").on_down == "control"  # the default: fail open
    with pytest.raises(ConfigError, match="SPECPROXY_SPECULATIVE__ON_DOWN"):
        serve.build_config(parse(), environ={**ARMS, "SPECPROXY_SPECULATIVE__ON_DOWN": "retry"})


def test_a_setting_from_a_file_as_mounted_secrets_give_it(tmp_path: Path) -> None:
    secret = tmp_path / "url"
    secret.write_text("postgresql://u:p@db/specproxy\n", encoding="utf-8")  # Secrets end in \n
    data, sources = env_settings({"SPECPROXY_STORE__URL_FILE": str(secret)})
    assert data == {"store": {"url": "postgresql://u:p@db/specproxy"}}
    assert sources == {"store.url": "SPECPROXY_STORE__URL_FILE"}
    top, _ = env_settings({"SPECPROXY_BASELINE_URL_FILE": str(secret)})
    assert top == {"baseline_url": "postgresql://u:p@db/specproxy"}
    # a setting whose own name ends in _file is that setting, not a file of another
    own, _ = env_settings({"SPECPROXY_SPECULATIVE__API_KEY_FILE": "/run/key"})
    assert own == {"speculative": {"api_key_file": "/run/key"}}
    # typed settings parse as their variable would
    (tmp_path / "days").write_text("7\n", encoding="utf-8")
    typed, _ = env_settings({"SPECPROXY_STORE__RETENTION_DAYS_FILE": str(tmp_path / "days")})
    assert typed == {"store": {"retention_days": 7}}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        (
            {"SPECPROXY_STORE__URL_FILE": "FILE", "SPECPROXY_STORE__URL": "sqlite:///x.db"},
            "SPECPROXY_STORE__URL_FILE and SPECPROXY_STORE__URL are both set",
        ),
        ({"SPECPROXY_STORE__URL_FILE": "/nonexistent/url"}, "cannot read /nonexistent/url"),
        ({"SPECPROXY_STORE__URLS_FILE": "FILE"}, "is not a specproxy setting"),
    ],
)
def test_a_bad_file_variable_is_one_clear_error(
    tmp_path: Path, environ: dict[str, str], expected: str
) -> None:
    (tmp_path / "f").write_text("x", encoding="utf-8")
    environ = {k: str(tmp_path / "f") if v == "FILE" else v for k, v in environ.items()}
    with pytest.raises(ConfigError, match=expected):
        env_settings(environ)


def test_a_misspelt_top_level_variable_is_an_error_with_the_nearest_name() -> None:
    # issue 29 item 10: one underscore where two are needed was silently ignored
    with pytest.raises(
        ConfigError, match=r"SPECPROXY_STORE_URL .*did you mean SPECPROXY_STORE__URL"
    ):
        env_settings({"SPECPROXY_STORE_URL": "postgresql://db/x"})
    with pytest.raises(
        ConfigError, match=r"SPECPROXY_ADMIN_TOKN .*did you mean SPECPROXY_ADMIN_TOKEN"
    ):
        env_settings({"SPECPROXY_ADMIN_TOKN": "t"})


def test_variables_read_elsewhere_are_left_alone() -> None:
    environ = {name: "x" for name in NOT_SETTINGS}
    assert env_settings(environ) == ({}, {})
