"""Settings from `SPECPROXY_*` environment variables, for containers (a Secret's PostgreSQL URL).

The rule, one variable per setting of `Config`:

    SPECPROXY_<KEY>              top-level key         SPECPROXY_BASELINE_URL -> baseline_url
    SPECPROXY_<SECTION>__<KEY>   key of a [section]    SPECPROXY_STORE__URL   -> [store].url

Names are the TOML keys in upper case; a double underscore separates the section from the key
(keys themselves contain single underscores). Values of string settings are taken verbatim;
every other value is written as it would be in TOML (`true`, `0.25`, `[300, 3600, "all"]`, and
an inline table for a nested table: `SPECPROXY_TIMEOUTS__SPECULATIVE='{read_s = 30}'`), and
an empty value unsets an optional setting (`SPECPROXY_STORE__RETENTION_DAYS=` keeps everything).

Any setting can also come from a file, for Secrets mounted as files: `SPECPROXY_<...>_FILE`
names the file whose text (without its trailing newline) is the value, as if it had been set
directly (`SPECPROXY_STORE__URL_FILE=/run/secrets/store-url`). Setting both the variable and its
`_FILE` is an error; a setting whose own name ends in `_file` (`[<arm>] api_key_file`) is that
setting.

Precedence, highest first: command-line flags > environment > config file > defaults.
`env_settings` only reads and parses; the merged mapping is validated by `Config.from_mapping`,
and `name_variable` adds the variable's name to a validation error about a setting it supplied.

A variable naming a setting that moved (`config.MOVED`) still works, as in the file, with a
warning naming its new place. The `SPECPROXY_*` variables that are not settings but are read
elsewhere (`NOT_SETTINGS`: the admin token, the stats child's handed-over config, the fleet
workers' directory and index, the vLLM test tier's python and cache) are left alone; any other
`SPECPROXY_*` variable is an error with the nearest valid name, so a typo such as
SPECPROXY_STORE_URL (one underscore) fails with "did you mean SPECPROXY_STORE__URL?" instead of
being silently ignored.
"""

from __future__ import annotations

import dataclasses
import tomllib
import types
import typing
from collections.abc import Mapping
from typing import Any

from specproxy.config import MOVED, Config, did_you_mean
from specproxy.errors import ConfigError

__all__ = [
    "FILE_SUFFIX",
    "MAX_VALUE_FILE_BYTES",
    "NOT_SETTINGS",
    "PREFIX",
    "env_settings",
    "file_and_env",
    "name_variable",
    "setting_fields",
    "variable_name",
]

PREFIX = "SPECPROXY_"
_SEP = "__"
FILE_SUFFIX = "_file"  # SPECPROXY_STORE__URL_FILE=/run/secrets/url: the value from a file
MAX_VALUE_FILE_BYTES = 64 * 1024
# `SPECPROXY_*` variables read outside `Config` (grep the tree for each before adding one here).
NOT_SETTINGS: frozenset[str] = frozenset(
    {
        "SPECPROXY_ADMIN_TOKEN",  # admin.ADMIN_TOKEN_ENV
        "SPECPROXY_ADMIN_TOKEN_FILE",  # admin.ADMIN_TOKEN_FILE_ENV
        "SPECPROXY_STATS_CHILD_CONFIG",  # stats.job.settings.CHILD_CONFIG_ENV
        "SPECPROXY_WORKER_DIR",  # fleet.workers.WORKER_DIR_ENV
        "SPECPROXY_WORKER_INDEX",  # fleet.workers.WORKER_INDEX_ENV
        "SPECPROXY_VLLM_PYTHON",  # realvllm.launcher
        "SPECPROXY_CACHE_DIR",  # realvllm.model_dir
        "SPECPROXY_NO_EXTENSIONS",  # native.NO_EXTENSIONS_ENV: the pure-Python references
        "SPECPROXY_REQUIRE_EXTENSIONS",  # setup.py: a failed compile fails the install
        # knobs of the test tiers, read by tests/ (a shell that sets them can still serve)
        "SPECPROXY_HOSTILE_EXAMPLES",
        "SPECPROXY_KEEP_BENCH_RESULT",
        "SPECPROXY_NAMESPACE",
        "SPECPROXY_VLLM_ATTACH",
        "SPECPROXY_VLLM_LOG_DIR",
    }
)


def setting_fields() -> dict[str | None, dict[str, Any]]:
    """{section name or None for the top level: {key: resolved type}}, derived from `Config`."""
    top = typing.get_type_hints(Config)
    tables: dict[str | None, dict[str, Any]] = {None: {}}
    for f in dataclasses.fields(Config):
        table = _table_type(top[f.name])
        if table is not None:
            hints = typing.get_type_hints(table)
            tables[f.name] = {g.name: hints[g.name] for g in dataclasses.fields(table)}
        else:
            tables[None][f.name] = top[f.name]
    return tables


def _table_type(kind: Any) -> type[Any] | None:
    """The dataclass of a `[table]` setting (`ArmConfig | None` included), else None."""
    candidates = [k for k in (kind, *typing.get_args(kind)) if dataclasses.is_dataclass(k)]
    return candidates[0] if candidates and isinstance(candidates[0], type) else None


def variable_name(section: str | None, key: str) -> str:
    """The variable that sets `key` (in `[section]`, or at the top level for None)."""
    return PREFIX + (key if section is None else section + _SEP + key).upper()


def env_settings(environ: Mapping[str, str]) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the environment gives, nested as in the TOML file, and {dotted setting:
    variable} saying where each came from. Raises `ConfigError` naming a bad variable."""
    tables = setting_fields()
    data: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for variable in sorted(environ):
        if not variable.startswith(PREFIX) or variable in NOT_SETTINGS:
            continue
        rest = variable[len(PREFIX) :].lower()
        raw = environ[variable]
        target_key = _file_target(rest, tables)
        if target_key is not None:  # SPECPROXY_STORE__URL_FILE: the value is that file's text
            if PREFIX + target_key.upper() in environ:
                raise ConfigError(
                    f"{variable} and {PREFIX + target_key.upper()} are both set: give one"
                )
            rest, raw = target_key, _read_value_file(variable, raw)
        section: str | None
        if _SEP in rest:
            section, key = rest.split(_SEP, 1)
            if _SEP in key and key.split(_SEP)[0] in tables.get(section, {}):
                inner, _, leaf = key.partition(_SEP)
                example = variable_name(section, inner)
                raise ConfigError(
                    f"{variable}: a nested table is one variable holding an inline TOML table, "
                    f"e.g. {example}='{{{leaf} = ...}}'"
                )
            moved = (section, key) in MOVED
            if key not in tables.get(section, {}) and not moved:
                _unknown(variable, tables)
        else:
            section, key = None, rest
            if key not in tables[None]:
                _unknown(variable, tables)
        value = _parse(variable, raw, _kind(tables, section, key))
        target = data if section is None else data.setdefault(section, {})
        target[key] = value
        sources[key if section is None else f"{section}.{key}"] = variable
    return data, sources


def _file_target(rest: str, tables: Mapping[str | None, Mapping[str, Any]]) -> str | None:
    """For `<setting>_file` (lower case, after the prefix) that is not itself a setting: the
    setting it names, else None."""
    if not rest.endswith(FILE_SUFFIX):
        return None
    target = rest[: -len(FILE_SUFFIX)]
    section, _, key = target.rpartition(_SEP) if _SEP in target else ("", "", target)
    own = section or None
    whole_section, _, whole_key = rest.rpartition(_SEP) if _SEP in rest else ("", "", rest)
    if whole_key in tables.get(whole_section or None, {}):
        return None  # a setting of its own (`[<arm>] api_key_file`)
    return target if key in tables.get(own, {}) else None


def _read_value_file(variable: str, path: str) -> str:
    """The text of the file a `..._FILE` variable names, without its trailing newline."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_VALUE_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{variable}: cannot read {path}: {exc.strerror}") from exc
    if len(data) > MAX_VALUE_FILE_BYTES:
        raise ConfigError(f"{variable}: {path} exceeds {MAX_VALUE_FILE_BYTES} bytes")
    try:
        return data.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{variable}: {path} is not UTF-8") from exc


def _kind(tables: Mapping[str | None, Mapping[str, Any]], section: str | None, key: str) -> Any:
    """The type of a setting, or of the place a moved one went (`config.MOVED`; Any: gone)."""
    if key in tables.get(section, {}):
        return tables[section][key]
    target = MOVED.get((section or "", key))
    return Any if target is None else tables[target[0]][target[1]]


def file_and_env(
    data: dict[str, Any], environ: Mapping[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The config file's settings (`data`, parsed TOML, updated in place) with the environment's
    over them, table by table; and where each environment setting came from (`env_settings`)."""
    env, sources = env_settings(environ)
    for key, value in env.items():
        if isinstance(value, dict):
            table = data.setdefault(key, {})
            if not isinstance(table, dict):
                raise ConfigError(f"[{key}] must be a table")
            table.update(value)
        else:
            data[key] = value
    return data, sources


def name_variable(exc: ConfigError, sources: Mapping[str, str]) -> ConfigError:
    """`exc` with the variable named when it is about a setting the environment supplied."""
    message = str(exc)
    for dotted, variable in sources.items():
        if message.startswith(dotted + " "):
            return ConfigError(f"{message} (set by {variable})")
    return exc


def _parse(variable: str, raw: str, kind: Any) -> Any:
    union = typing.get_origin(kind) in (typing.Union, types.UnionType)
    members = [k for k in typing.get_args(kind) if k is not type(None)] if union else [kind]
    if union and len(members) < len(typing.get_args(kind)) and raw.strip() == "":
        return None  # `X | None`: empty unsets
    if all(k is str or typing.get_origin(k) is typing.Literal for k in members):
        return raw
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        raise ConfigError(
            f"{variable}={raw!r} is not a TOML value (write it as in the config file, e.g. "
            'true, 0.5, [300, 3600, "all"])'
        ) from None


def _unknown(variable: str, tables: Mapping[str | None, Mapping[str, Any]]) -> typing.NoReturn:
    candidates = [variable_name(s, k) for s, keys in tables.items() for k in keys]
    candidates += sorted(NOT_SETTINGS)
    raise ConfigError(f"{variable} is not a specproxy setting{did_you_mean(variable, candidates)}")
