"""An arm's own request headers from its config: its `headers` and its API key.

The key is read once, at start-up, from the file `api_key_file` names (a mounted Secret) or the
environment variable `api_key_env` names; never from a flag, never logged (`ArmHeaders`'s repr
hides it). A missing, empty or malformed key is a `ConfigError` naming the setting, so `serve`
stops with one line before it listens.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from specproxy.config import ArmConfig, Config
from specproxy.errors import ConfigError
from specproxy.proxy.headers import ArmHeaders
from specproxy.records import Arm

__all__ = ["MAX_KEY_BYTES", "arm_headers", "every_arm_headers", "read_api_key"]

MAX_KEY_BYTES = 8192  # an API key or token; a longer file is the wrong file


def read_api_key(cfg: ArmConfig, environ: Mapping[str, str] | None = None) -> str | None:
    """The arm's API key (None without one); leading and trailing whitespace is dropped."""
    env = os.environ if environ is None else environ
    if cfg.api_key_file is not None:
        setting = f"{cfg.name}.api_key_file"
        try:
            with Path(cfg.api_key_file).open("rb") as f:
                raw = f.read(MAX_KEY_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"{setting}: cannot read {cfg.api_key_file}: {exc.strerror}") from exc
        if len(raw) > MAX_KEY_BYTES:
            raise ConfigError(f"{setting}: {cfg.api_key_file} exceeds {MAX_KEY_BYTES} bytes")
        key = raw.decode("ascii", "replace").strip()
    elif cfg.api_key_env is not None:
        setting = f"{cfg.name}.api_key_env"
        if cfg.api_key_env not in env:
            raise ConfigError(f"{setting}: the variable {cfg.api_key_env} is not set")
        key = env[cfg.api_key_env].strip()
    else:
        return None
    if not key:
        raise ConfigError(f"{setting}: the key is empty")
    if not all("!" <= c <= "~" for c in key):
        raise ConfigError(f"{setting}: the key must be one token of visible ASCII characters")
    return key


def arm_headers(cfg: ArmConfig, environ: Mapping[str, str] | None = None) -> ArmHeaders:
    """What the arm adds to every request it is sent."""
    return ArmHeaders(
        cfg.headers,
        read_api_key(cfg, environ),
        replace_authorization=cfg.authorization == "arm",
    )


def every_arm_headers(
    cfg: Config, environ: Mapping[str, str] | None = None
) -> dict[Arm, ArmHeaders]:
    """`arm_headers` of every arm."""
    return {arm: arm_headers(cfg.arm_config(arm), environ) for arm in cfg.arm_names}
