"""An arm's API key: from a file or an environment variable, read once, every fault one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from specproxy.config import ArmConfig, Config
from specproxy.errors import ConfigError
from specproxy.proxy.armauth import MAX_KEY_BYTES, arm_headers, every_arm_headers, read_api_key
from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT


def test_the_key_comes_from_a_file_or_a_variable(tmp_path: Path) -> None:
    secret = tmp_path / "key"
    secret.write_text("sk-from-file\n", encoding="utf-8")  # a Secret's file ends in a newline
    assert read_api_key(ArmConfig(api_key_file=str(secret), name="b")) == "sk-from-file"
    from_env = ArmConfig(api_key_env="ARM_KEY", name="b")
    assert read_api_key(from_env, {"ARM_KEY": " sk-env "}) == "sk-env"
    assert read_api_key(ArmConfig(name="b"), {}) is None
    own = arm_headers(ArmConfig(api_key_env="ARM_KEY", authorization="arm"), {"ARM_KEY": "k"})
    assert own.added(client_authorization=True) == [("Authorization", "Bearer k")]


@pytest.mark.parametrize(
    ("settings", "content", "expected"),
    [
        ({"api_key_file": "missing"}, None, "b.api_key_file: cannot read"),
        ({"api_key_file": "key"}, "\n", "b.api_key_file: the key is empty"),
        ({"api_key_file": "key"}, "two words", "visible ASCII"),
        ({"api_key_file": "key"}, "x" * (MAX_KEY_BYTES + 1), "exceeds"),
        ({"api_key_env": "NOT_SET"}, None, "b.api_key_env: the variable NOT_SET is not set"),
    ],
)
def test_a_bad_key_is_a_config_error_naming_the_setting(
    tmp_path: Path, settings: dict[str, str], content: str | None, expected: str
) -> None:
    if content is not None:
        (tmp_path / "key").write_text(content, encoding="utf-8")
    values = {k: str(tmp_path / v) if k == "api_key_file" else v for k, v in settings.items()}
    with pytest.raises(ConfigError, match=expected):
        cfg = ArmConfig(
            api_key_file=values.get("api_key_file"), api_key_env=values.get("api_key_env"), name="b"
        )
        read_api_key(cfg, {})


def test_every_arm_gets_its_own() -> None:
    cfg = Config.from_mapping(
        {
            "baseline_url": "http://b:1",
            "speculative": {"urls": ["http://gw:4000"], "headers": {"X-Tenant": "t"}},
        }
    )
    own = every_arm_headers(cfg, {})
    assert own[SHORTHAND_CONTROL].empty
    assert own[SHORTHAND_TREATMENT].added(client_authorization=False) == [("X-Tenant", "t")]
