from __future__ import annotations

import json
import re
import textwrap
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specproxy.config import (
    Config,
    RampConfig,
    RoutingConfig,
    ScrapeConfig,
    StatsConfig,
    StoreConfig,
    TimeoutConfig,
    WarmupConfig,
    load_toml,
    section,
)
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
        # issue 29 item 10: numbers are type-checked, one clear error naming the setting
        ({"port": 8000.5}, r"^port must be a whole number, got 8000.5$"),
        ({"port": True}, r"^port must be a number, got True$"),
        ({"store": {"batch_size": 10.0}}, r"^store.batch_size must be a whole number"),
        ({"stats": {"windows_s": ["x"]}}, r'^stats.windows_s entries must be seconds or "all"'),
        ({"stats": {"windows_s": [300, False]}}, r"^stats.windows_s entries .*got False$"),
        ({"stats": {"windows_s": "300"}}, r"^stats.windows_s must be a list"),
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


def test_one_url_is_shorthand_for_a_one_endpoint_arm() -> None:
    cfg = Config.from_mapping(ARMS)
    assert cfg.arm_config("baseline").urls == ("http://127.0.0.1:9001",)
    assert cfg.arm_config("speculative").dns is None


def test_arm_as_a_list_of_urls_and_as_a_dns_name(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        "[speculative]\n"
        'urls = ["http://10.0.0.1:8000/", "http://10.0.0.2:8000"]\n'
        "[baseline]\n"
        'dns = "vllm-base.llm.svc.cluster.local"\nport = 8001\nrefresh_s = 10\n'
        "[outlier]\neject_after_failures = 3\n"
    )
    cfg = Config.from_toml(path, model_allow=["m"])
    spec, base = cfg.arm_config("speculative"), cfg.arm_config("baseline")
    assert spec.urls == ("http://10.0.0.1:8000/", "http://10.0.0.2:8000")
    assert cfg.upstream_url("speculative") == "http://10.0.0.1:8000"
    assert (base.dns, base.port, base.refresh_s, base.urls) == (
        "vllm-base.llm.svc.cluster.local",
        8001,
        10,
        (),
    )
    assert cfg.upstream_url("baseline") == "http://vllm-base.llm.svc.cluster.local:8001"
    assert cfg.outlier.eject_after_failures == 3
    assert cfg.model_allow == ("m",)
    assert spec.dcgm_urls == spec.dcgm_gpus == spec.dcgm_pods == ()  # GPU telemetry is optional


def test_an_arm_with_gpu_telemetry(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        'baseline_url = "http://b:8000"\n'
        "[speculative]\n"
        'urls = ["http://s:8000"]\n'
        'dcgm_urls = ["http://gpu-a:9400", "http://gpu-b:9400/metrics"]\n'
        'dcgm_gpus = ["0", "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52"]\n'
        'dcgm_pods = ["vllm-speculative-"]\n'
    )
    spec = Config.from_toml(path).arm_config("speculative")
    assert spec.dcgm_urls == ("http://gpu-a:9400", "http://gpu-b:9400/metrics")
    assert spec.dcgm_gpus == ("0", "GPU-604ac76c-d9cf-fef3-62e9-d92044ab6e52")
    assert spec.dcgm_pods == ("vllm-speculative-",)


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"speculative_url": "http://a:1"}, "baseline_url is required"),
        ({**ARMS, "baseline": {"urls": ["http://x:1"]}}, "cannot both be given"),
        (
            {"speculative_url": "http://a:1", "baseline": {"urls": ["ftp://x"]}},
            "baseline.urls must be absolute",
        ),
        ({"speculative_url": "http://a:1", "baseline": {}}, "baseline needs exactly one"),
        (
            {"speculative_url": "http://a:1", "baseline": {"urls": ["http://x:1"], "dns": "h"}},
            "baseline needs exactly one",
        ),
        ({"speculative_url": "http://a:1", "baseline": {"urls": "http://x:1"}}, "must be a list"),
        ({"speculative_url": "http://a:1", "baseline": {"dns": "h", "port": 0}}, "baseline.port"),
        (
            {"speculative_url": "http://a:1", "baseline": {"dns": "h", "refresh_s": 0}},
            "baseline.refresh_s",
        ),
        ({"speculative_url": "http://a:1", "baseline": {"dns": "a/b"}}, "baseline.dns"),
        ({"speculative_url": "http://a:1", "baseline": {"bogus": 1}}, "baseline.bogus"),
        ({**ARMS, "outlier": {"max_ejection_s": 1}}, "outlier.max_ejection_s"),
        ({**ARMS, "control": {"poll_s": 0}}, "control.poll_s"),
        ({**ARMS, "model_allow": "m"}, "model_allow must be a list"),
        ({**ARMS, "model_allow": [""]}, "model_allow"),
        (
            {
                "speculative_url": "http://a:1",
                "baseline": {"urls": ["http://x:1"], "dcgm_urls": "h"},
            },
            "baseline.dcgm_urls must be a list",
        ),
        (
            {"speculative_url": "http://a:1", "baseline": {"dns": "h", "dcgm_urls": ["h:9400"]}},
            "baseline.dcgm_urls must be absolute",
        ),
        (
            {
                "speculative_url": "http://a:1",
                "baseline": {"dns": "h", "dcgm_urls": ["http://g:9400", "http://g:9400"]},
            },
            "baseline.dcgm_urls has duplicates",
        ),
        (
            {"speculative_url": "http://a:1", "baseline": {"dns": "h", "dcgm_gpus": ["0"]}},
            "baseline.dcgm_gpus needs dcgm_urls",
        ),
        (
            {
                "speculative_url": "http://a:1",
                "baseline": {"dns": "h", "dcgm_urls": ["http://g:9400"], "dcgm_gpus": [0]},
            },
            "baseline.dcgm_gpus must be a list of GPU indices or UUIDs",
        ),
        (
            {"speculative_url": "http://a:1", "baseline": {"dns": "h", "dcgm_pods": ["vllm-"]}},
            "baseline.dcgm_pods needs dcgm_urls",
        ),
        (
            {
                "speculative_url": "http://a:1",
                "baseline": {"dns": "h", "dcgm_urls": ["http://g:9400"], "dcgm_pods": [""]},
            },
            "baseline.dcgm_pods must be a list of pod-name prefixes",
        ),
    ],
)
def test_bad_arm_config_names_the_setting(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config.from_mapping(data)


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: StatsConfig(resamples=5), "stats.resamples"),
        (lambda: RoutingConfig(speculative_share=2.0), "routing.speculative_share"),
        (lambda: TimeoutConfig(read_s=0), "timeouts.read_s"),
        (lambda: StoreConfig(url="mysql://x"), "store.url"),
        (lambda: ScrapeConfig(interval_s=-1), "scrape.interval_s"),
    ],
)
def test_each_section_validates_itself_when_built_directly(
    build: Callable[[], object], needle: str
) -> None:
    with pytest.raises(ConfigError, match=needle):
        build()


@pytest.mark.parametrize(
    ("data", "needle"),
    [
        ({"stats": {"resampels": 500}}, r"stats\.resampels \(did you mean stats\.resamples\?\)"),
        ({"stat": {}}, r"unknown setting\(s\): stat \(did you mean stats\?\)"),
        ({"baseline_ulr": "x"}, r"baseline_ulr \(did you mean baseline_url\?\)"),
        ({"zzz": 1}, r"unknown setting\(s\): zzz$"),
    ],
)
def test_a_misspelt_key_gets_a_suggestion(data: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        Config.from_mapping({**ARMS, **data})


def test_load_toml_returns_the_unvalidated_table(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("[stats]\nresamples = 5\n")  # invalid as a setting, but valid TOML
    assert load_toml(path) == {"stats": {"resamples": 5}}
    with pytest.raises(ConfigError, match="cannot read"):
        load_toml(tmp_path / "missing.toml")


def test_stats_future_skew_is_a_non_negative_number_of_seconds() -> None:
    """How far past now a row's stamp may be before the windows leave it out: 5 s unless set,
    0 allowed (not one second ahead), negative or not a number refused at load."""
    assert Config.from_mapping(ARMS).stats.future_skew_s == 5.0
    cfg = Config.from_mapping({**ARMS, "stats": {"future_skew_s": 0}})
    assert cfg.stats.future_skew_s == 0
    with pytest.raises(ConfigError, match=r"stats\.future_skew_s must be >= 0"):
        Config.from_mapping({**ARMS, "stats": {"future_skew_s": -1}})
    with pytest.raises(ConfigError, match=r"stats\.future_skew_s must be a number"):
        Config.from_mapping({**ARMS, "stats": {"future_skew_s": "5s"}})


def test_stats_compute_is_child_or_external() -> None:
    assert Config.from_mapping(ARMS).stats.compute == "child"
    cfg = Config.from_mapping({**ARMS, "stats": {"compute": "external"}})
    assert cfg.stats.compute == "external"
    with pytest.raises(ConfigError, match=r"stats\.compute must be child or external"):
        Config.from_mapping({**ARMS, "stats": {"compute": "thread"}})


@pytest.mark.parametrize(
    "data",
    [
        ARMS,
        {
            "baseline": {"dns": "vllm.svc", "port": 9000, "dcgm_urls": ["http://d:9400"]},
            "speculative": {"urls": ["http://a:1", "http://b:2"]},
            "timeouts": {"read_s": 30, "speculative": {"read_s": 5}},
            "stats": {"windows_s": [300, "all"], "compute": "external", "p99_tolerance": 0},
            "store": {"url": "memory://", "retention_days": 7},
            "routing": {"seed": 3},
            "model_allow": ["m"],
        },
    ],
)
def test_to_mapping_is_plain_json_that_loads_back_equal(data: dict[str, object]) -> None:
    """What serve hands its stats process (JSON in its environment) is the same config."""
    cfg = Config.from_mapping(data)
    assert Config.from_mapping(json.loads(json.dumps(cfg.to_mapping()))) == cfg


def test_a_table_on_its_own_is_validated_as_in_the_whole_config() -> None:
    assert section(StatsConfig, {"alpha": 0.1}, "stats").alpha == 0.1
    with pytest.raises(ConfigError, match=r"stats\.alpha"):
        section(StatsConfig, {"alpha": 0.9}, "stats")
    with pytest.raises(ConfigError, match=r"unknown setting\(s\): stats\.alpah"):
        section(StatsConfig, {"alpah": 0.1}, "stats")
    with pytest.raises(ConfigError, match=r"\[stats\] must be a table"):
        section(StatsConfig, 3, "stats")


def test_settings_that_moved_still_work_and_say_where_they_went(
    caplog: pytest.LogCaptureFixture,
) -> None:
    data = {
        "baseline_url": "http://b:1",
        "speculative_url": "http://s:2",
        "stats": {"warmup_requests": 7, "raw_rows_max": 10},
        "scrape": {"warmup_requests": 3, "warmup_seconds": 1.5},
        "store": {"rollup_fine_minutes": 10, "rollup_minute_hours": 2.0},
    }
    with caplog.at_level("WARNING", logger="specproxy.config"):
        cfg = Config.from_mapping(data)
    assert cfg.warmup == WarmupConfig(requests=7, restart_requests=3, restart_seconds=1.5)
    said = caplog.text
    assert "stats.warmup_requests moved to [warmup] requests" in said
    assert "scrape.warmup_seconds moved to [warmup] restart_seconds" in said
    for gone in ("stats.raw_rows_max", "store.rollup_fine_minutes", "store.rollup_minute_hours"):
        assert f"{gone} is no longer a setting" in said
    # the new place wins over the old one
    both = {**data, "warmup": {"requests": 1}}
    assert Config.from_mapping(both).warmup.requests == 1


def test_on_down_is_an_arm_setting_that_defaults_to_failing_open() -> None:
    cfg = Config.from_mapping({**ARMS})
    assert cfg.arm_config("speculative").on_down == "control"
    table = Config.from_mapping(
        {"baseline_url": "http://b:1", "speculative": {"urls": ["http://s:1"], "on_down": "error"}}
    )
    assert table.arm_config("speculative").on_down == "error"
    assert Config.from_mapping(table.to_mapping()) == table
    with pytest.raises(ConfigError, match=r"speculative\.on_down must be control or error"):
        Config.from_mapping({**ARMS, "speculative": {"on_down": "nope"}})
    with pytest.raises(ConfigError, match="speculative needs exactly one of urls"):
        Config.from_mapping({"baseline_url": "http://b:1", "speculative": {"on_down": "error"}})


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        ({"metrics_urls": ["http://e:8000"], "metrics_dns": "e"}, "metrics_urls or metrics_dns"),
        ({"metrics_urls": ["e:8000"]}, "speculative.metrics_urls must be absolute"),
        ({"metrics_urls": ["http://e:1", "http://e:1"]}, "metrics_urls has duplicates"),
        ({"metrics_dns": "a/b"}, "speculative.metrics_dns must be a host name"),
        ({"metrics_port": 0}, "speculative.metrics_port"),
        ({"headers": {"Authorization": "Bearer x"}}, "api_key_file or api_key_env"),
        ({"headers": {"Host": "x"}}, "may not set Host"),
        ({"headers": {"X-Specproxy-Arm": "x"}}, "may not set"),
        ({"headers": {"bad name": "x"}}, "bad header name"),
        ({"headers": {"X-A": "a\r\nX-B: b"}}, "without CR, LF or NUL"),
        ({"headers": ["X-A"]}, "speculative.headers must be a table"),
        ({"api_key_file": "/k", "api_key_env": "K"}, "api_key_file or api_key_env, not both"),
        ({"api_key_env": ""}, "speculative.api_key_env must be a non-empty string"),
        ({"authorization": "arm"}, '"arm" needs an API key'),
        ({"authorization": "both"}, "must be client or arm"),
    ],
)
def test_arm_gateway_settings_are_validated(table: dict[str, object], expected: str) -> None:
    data = {"baseline_url": "http://b:1", "speculative": {"urls": ["http://gw:4000"], **table}}
    with pytest.raises(ConfigError, match=re.escape(expected)):
        Config.from_mapping(data)


def test_an_arm_behind_a_gateway_keeps_its_engines_and_round_trips() -> None:
    data = {
        "baseline_url": "http://b:1",
        "speculative": {
            "urls": ["http://gw:4000"],
            "metrics_urls": ["http://e1:8000", "http://e2:8000"],
            "headers": {"X-Tenant": "t"},
            "api_key_env": "KEY",
        },
    }
    cfg = Config.from_mapping(data)
    arm = cfg.arm_config("speculative")
    assert arm.scrapes_elsewhere and arm.has_api_key and arm.headers == {"X-Tenant": "t"}


# ---- A/B/n: [arms.NAME] tables, and the two-arm shorthand -------------------------------------

README_TWO_ARMS = """
baseline_url = "http://10.0.0.2:8000"
speculative_url = "http://10.0.0.3:8000"
run_id = "llama70b-ngram-k4"
[routing]
mode = "weighted"            # or "sticky" (sticky_source = "header" | "user")
speculative_share = 0.5
mirror_fraction = 0.1        # 10 % of requests also shadowed on the other arm
[store]
url = "postgresql://specproxy@db/specproxy"   # several replicas share one store
[stats]
windows_s = [300, 3600, "all"]
p99_tolerance = 0.05         # "slower" means spec P99 > baseline P99 x 1.05
"""  # README's two-arm config, as it stood before A/B/n

THREE_ARMS = """
[arms.base]
role = "control"
urls = ["http://10.0.0.2:8000"]
[arms.ngram-k2]
urls = ["http://10.0.0.3:8000"]
labels = { method = "ngram", k = 2 }
[arms.ngram-k4]
weight = 2
dns = "vllm-k4.llm.svc.cluster.local"
timeouts = { read_s = 30 }
"""


def test_the_readmes_two_arm_config_loads_as_before(tmp_path: Path) -> None:
    path = tmp_path / "two.toml"
    path.write_text(README_TWO_ARMS)
    cfg = Config.from_toml(path)
    assert (cfg.baseline_url, cfg.speculative_url) == (
        "http://10.0.0.2:8000",
        "http://10.0.0.3:8000",
    )
    assert cfg.arm_names == ("baseline", "speculative") and cfg.control_arm == "baseline"
    assert cfg.treatment_arms == ("speculative",) and cfg.shorthand
    assert cfg.arm_shares() == {"baseline": 0.5, "speculative": 0.5}
    assert cfg.routing.mirror_fraction == 0.1 and cfg.upstream_url("speculative").endswith(":8000")
    assert Config.from_mapping(cfg.to_mapping()) == cfg


README = Path(__file__).resolve().parents[1] / "README.md"
TOML_BLOCK = re.compile(r"^( *)```toml\n(.*?)^\1```", re.M | re.S)


def readme_configs() -> list[str]:
    """Every ```toml block of README.md, dedented (some sit in a list item)."""
    return [textwrap.dedent(m.group(2)) for m in TOML_BLOCK.finditer(README.read_text("utf-8"))]


def test_the_held_two_arm_config_is_the_readmes() -> None:
    """README_TWO_ARMS is the README's first config, word for word: the README still shows
    users the two-arm form this test proves loads as before."""
    blocks = readme_configs()
    assert blocks[0].strip() == README_TWO_ARMS.strip()


def test_every_config_the_readme_shows_loads() -> None:
    """A user pastes what the README shows: each block loads (a block that shows one arm's
    table gets the other arm's URL, as the text around it assumes)."""
    blocks = readme_configs()
    assert len(blocks) >= 4
    for block in blocks:
        data = tomllib.loads(block)
        if "arms" not in data:
            for arm in ("baseline", "speculative"):
                if arm not in data and f"{arm}_url" not in data:
                    data[f"{arm}_url"] = "http://127.0.0.1:1"
        cfg = Config.from_mapping(data)
        assert cfg.control_arm in cfg.arm_names, block


def test_arms_tables_name_the_arms_roles_weights_labels_and_timeouts(tmp_path: Path) -> None:
    path = tmp_path / "three.toml"
    path.write_text(THREE_ARMS)
    cfg = Config.from_toml(path)
    assert cfg.arm_names == ("base", "ngram-k2", "ngram-k4") and not cfg.shorthand
    assert cfg.arm_shares() == {"base": 0.25, "ngram-k2": 0.25, "ngram-k4": 0.5}
    assert cfg.arm_config("ngram-k2").labels == {"method": "ngram", "k": "2"}
    assert cfg.arm_timeouts("ngram-k4").read_s == 30 and cfg.arm_timeouts("base").read_s == 120
    assert cfg.upstream_url("ngram-k4") == "http://vllm-k4.llm.svc.cluster.local:8000"
    assert Config.from_mapping(cfg.to_mapping()) == cfg


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("sqlite:/x.db", "sqlite:///x.db"),  # one slash: it silently wrote ./x.db
        ("sqlite:x.db", "sqlite:///x.db"),
        ("x.db", "no scheme: for a SQLite file write sqlite:///x.db"),
        ("/var/lib/specproxy.db", "sqlite:////var/lib/specproxy.db"),
    ],
)
def test_a_store_url_without_sqlites_three_slashes_is_refused(url: str, message: str) -> None:
    """Issue 28 item 5: `sqlite:/x.db` was accepted and wrote ./x.db."""
    with pytest.raises(ConfigError, match=r"store\.url") as info:
        StoreConfig(url=url)
    assert message in str(info.value)
    assert StoreConfig(url="sqlite:///x.db").url == "sqlite:///x.db"
    assert StoreConfig(url="sqlite:////abs/x.db").url == "sqlite:////abs/x.db"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"baseline_url": "http://a:1"}, "cannot be mixed with the two-arm shorthand"),
        ({"routing": {"speculative_share": 0.2}}, "routing.speculative_share"),
        ({"arms": {"base": {"role": "control", "urls": ["http://a:1"]}}}, "2 to 8 arms"),
        (
            {"arms": {"Base": {"role": "control", "urls": ["http://a:1"]}, "k": {"dns": "k"}}},
            "no valid arm name",
        ),
        ({"arms": {"a": {"urls": ["http://a:1"]}, "b": {"urls": ["http://b:1"]}}}, "exactly one"),
        ({"arms": {"a": {"role": "control"}, "b": {"urls": ["http://b:1"]}}}, "needs exactly one"),
        (
            {"arms": {"a": {"role": "boss", "urls": ["http://a:1"]}, "k": {"dns": "k"}}},
            "control or treatment",
        ),
    ],
)
def test_bad_arms_are_one_clear_config_error(data: dict[str, Any], message: str) -> None:
    arms = {"base": {"role": "control", "urls": ["http://a:1"]}, "k2": {"urls": ["http://b:1"]}}
    merged = {"arms": arms, **data}
    with pytest.raises(ConfigError, match=message) as caught:
        Config.from_mapping(merged)
    assert "\n" not in str(caught.value)


def test_at_most_eight_arms_with_bounded_labels() -> None:
    nine: dict[str, dict[str, Any]] = {f"a{i}": {"urls": [f"http://h{i}:1"]} for i in range(9)}
    nine["a0"]["role"] = "control"
    with pytest.raises(ConfigError, match="2 to 8 arms, got 9"):
        Config.from_mapping({"arms": nine})
    long: dict[str, dict[str, Any]] = {"base": {"role": "control", "urls": ["http://a:1"]}}
    long["k"] = {"urls": ["http://b:1"], "labels": {"note": "x" * 65}}
    with pytest.raises(ConfigError, match="at most 64 characters"):
        Config.from_mapping({"arms": long})


def test_the_shorthand_tables_keep_role_and_weight_to_themselves() -> None:
    with pytest.raises(ConfigError, match="role and weight are the shorthand"):
        Config.from_mapping(
            {"baseline_url": "http://a:1", "speculative": {"urls": ["http://b:1"], "weight": 3}}
        )


def test_the_ramp_config_validates_itself() -> None:
    cfg = Config.from_mapping(
        {
            **ARMS,
            "ramp": {
                "enabled": True,
                "schedule": [0.1, 0.5],
                "dry_run": True,
                "arms": ["speculative"],
            },
        }
    )
    assert cfg.ramp.schedule == (0.1, 0.5) and cfg.ramp.arms == ("speculative",)
    for bad in ([], [0.5, 0.1], [0.0, 0.5], [0.5, 1.5], [True]):
        with pytest.raises(ConfigError, match=r"ramp\.schedule"):
            RampConfig(schedule=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"ramp\.min_samples"):
        RampConfig(min_samples=0)
    with pytest.raises(ConfigError, match=r"ramp\.min_minutes"):
        RampConfig(min_minutes=-1)
    with pytest.raises(ConfigError, match=r"ramp\.arms names no treatment arm: baseline"):
        Config.from_mapping({**ARMS, "ramp": {"arms": ["baseline"]}})
