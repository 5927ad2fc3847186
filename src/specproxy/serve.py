"""`specproxy serve`: run the A/B proxy from a TOML file and/or command-line flags.

Flags override the file; the merged settings are validated into one `Config`, so a bad setting
stops the proxy before it listens. The server runs on uvloop (when installed) with
`handler_cancellation=True`, so a client that disconnects cancels its handler, which closes the
upstream connection and makes vLLM abort the generation.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import gc
import logging
import os
import sys
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from specproxy.admin import load_admin_token
from specproxy.app import create_app
from specproxy.appkeys import METRICS_VIEW, REGISTRY, ROUTER
from specproxy.config import Config, load_toml
from specproxy.config_env import file_and_env, name_variable, variable_name
from specproxy.errors import ConfigError
from specproxy.fleet.workers import merged_metrics, supervise, this_worker, worker_argv
from specproxy.listen import listen_socket, serve_app
from specproxy.proxy.armauth import every_arm_headers
from specproxy.stats.job.supervisor import StatsChild, needs_stats_process

__all__ = ["build_config", "configure", "freeze_startup_objects", "run"]

log = logging.getLogger(__name__)

# flag destination -> (section or None for top level, setting name)
_FLAG_SETTINGS: dict[str, tuple[str | None, str]] = {
    "baseline": (None, "baseline_url"),
    "speculative": (None, "speculative_url"),
    "host": (None, "host"),
    "port": (None, "port"),
    "run_id": (None, "run_id"),
    "inject_usage": (None, "inject_usage"),
    "mode": ("routing", "mode"),
    "share": ("routing", "speculative_share"),
    "sticky_source": ("routing", "sticky_source"),
    "sticky_header": ("routing", "sticky_header"),
    "allow_forced_arm": ("routing", "allow_forced_arm"),
    "mirror": ("routing", "mirror_fraction"),
    "max_shadows": ("routing", "max_concurrent_shadows"),
    "seed": ("routing", "seed"),
    "connect_timeout": ("timeouts", "connect_s"),
    "read_timeout": ("timeouts", "read_s"),
    "total_timeout": ("timeouts", "total_s"),
    "store": ("store", "url"),
}


def configure(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("--config", metavar="FILE.toml", help="TOML config file (flags override it)")
    add(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="proxy processes sharing the port (SO_REUSEPORT), one /metrics view (default 1)",
    )
    add("--baseline", metavar="URL", help="base URL of the baseline vLLM server")
    add("--speculative", metavar="URL", help="base URL of the speculative vLLM server")
    add("--host", help="listen address")
    add("--port", type=int, help="listen port")
    add("--run-id", help="label of this run in the store")
    add("--share", type=float, help="speculative share, 0..1")
    add("--mode", choices=["weighted", "sticky"], help="routing mode")
    add("--sticky-source", choices=["header", "user"], help="sticky key: a header or body.user")
    add("--sticky-header", help="header holding the sticky key")
    add(
        "--allow-forced-arm",
        action="store_true",
        default=None,
        help="honour the x-specproxy-arm request header",
    )
    add("--mirror", type=float, help="fraction of requests also sent to the other arm")
    add("--max-shadows", type=int, help="cap on concurrent mirrored requests")
    add("--seed", type=int, help="seed of the routing RNG")
    add(
        "--no-inject-usage",
        dest="inject_usage",
        action="store_false",
        default=None,
        help="never ask upstream for a usage chunk the client did not request",
    )
    add("--connect-timeout", type=float, help="upstream connect timeout, seconds")
    add(
        "--read-timeout",
        type=float,
        help="a stream's longest upstream silence, seconds",
    )
    add(
        "--total-timeout",
        type=float,
        help="a non-streaming call's deadline, seconds",
    )
    add(
        "--store",
        metavar="URL",
        help="record store URL (sqlite:///..., postgresql://..., memory://)",
    )
    _show_config_defaults(parser)


def _config_default(section: str | None, name: str) -> object:
    """The built-in value of a setting (what applies when neither file, env nor flag sets it)."""
    top = {f.name: f for f in dataclasses.fields(Config)}
    if section is None:
        default: object = top[name].default
        return None if default is dataclasses.MISSING or default == "" else default
    factory = top[section].default_factory
    assert factory is not dataclasses.MISSING
    return getattr(factory(), name)


def _show_config_defaults(parser: argparse.ArgumentParser) -> None:
    """Each flag's help names the setting's built-in default (the flags default to None, so that
    only flags given override the file and the environment)."""
    for action in parser._actions:
        setting = _FLAG_SETTINGS.get(action.dest)
        if setting is None or action.help is None or isinstance(action, argparse._StoreFalseAction):
            continue
        value = _config_default(*setting)
        if value is not None:
            shown = str(value).lower() if isinstance(value, bool) else value
            action.help += f" (default: {shown})"


def build_config(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Config:
    """Merge the TOML file (if any), the `SPECPROXY_*` environment (`specproxy.config_env`) and
    the flags that were given, in that order (later wins), then validate."""
    data: dict[str, Any] = load_toml(args.config) if getattr(args, "config", None) else {}
    data, env_sources = file_and_env(data, os.environ if environ is None else environ)
    for dest, (section, name) in _FLAG_SETTINGS.items():
        value = getattr(args, dest, None)
        if value is None:
            continue
        target = data if section is None else data.setdefault(section, {})
        if not isinstance(target, dict):
            raise ConfigError(f"[{section}] must be a table")
        target[name] = value
        env_sources.pop(name if section is None else f"{section}.{name}", None)
    for name in ("baseline_url", "speculative_url"):
        if "arms" in data:
            break  # [arms.NAME] tables name every arm (README, "A/B/n")
        if name not in data and name.removesuffix("_url") not in data:
            flag = "--" + name.removesuffix("_url")
            variable = variable_name(None, name)
            raise ConfigError(f"{name} is required (flag {flag}, {variable} or the config file)")
    try:
        return Config.from_mapping(data)
    except ConfigError as exc:
        raise name_variable(exc, env_sources) from exc


def run(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    every_arm_headers(cfg)  # an arm's unreadable API key: one line, before anything starts
    worker = this_worker()
    if args.workers < 1:
        raise ConfigError("--workers must be >= 1")
    if args.workers > 1 and worker is None:
        if cfg.port == 0:
            raise ConfigError("--workers needs a fixed --port: the workers share it")
        # One stats process for all the workers, started here; they only follow its results.
        child = StatsChild(cfg) if needs_stats_process(cfg) else None
        return supervise(worker_argv(sys.argv[1:]), args.workers, stats_child=child)
    admin_token = load_admin_token()
    # Bind before anything starts, so a port in use is one error line and exit 2, and the
    # "serving" line below is logged only once the proxy really listens. Workers share the
    # port (SO_REUSEPORT: the kernel spreads connections over them).
    sock = listen_socket(cfg.host, cfg.port, reuse_port=worker is not None)
    app = create_app(cfg, admin_token=admin_token)
    unix_path: str | None = None
    if worker is not None:
        registry = app[REGISTRY]

        async def every_worker() -> bytes:
            return await merged_metrics(registry, worker, token=admin_token)

        app[METRICS_VIEW] = every_worker
        unix_path = worker.socket  # where the other workers read this one's registry
    app.on_startup.append(freeze_startup_objects)  # last hook: after every component started

    async def announce(app: web.Application) -> None:
        shares = app[ROUTER].shares  # after the stored arm events (`specproxy arms`) applied
        log.info(
            "specproxy on http://%s:%d -> %s",
            cfg.host,
            sock.getsockname()[1],
            ", ".join(
                f"{arm} {cfg.upstream_url(arm)} (share {shares[arm]:.2f}"
                + (", control)" if arm == cfg.control_arm else ")")
                for arm in cfg.arm_names
            ),
        )

    app.on_startup.append(announce)
    serve_app(app, sock, loop=_new_loop(), unix_path=unix_path)
    return 0


# Young-generation threshold while serving. A request leaves a few tracked objects behind (its
# record in the ring, ...), so with Python's default of 700 a collection ran every ~150 requests,
# ~1.5% of the proxy's CPU under load; at 3000 it runs every ~2,400 requests (~0.2%), each one
# pausing ~1 ms instead of ~0.5 ms, which touches far fewer requests (measured with gc.callbacks
# under benchmarks/bench_proxy.py's load).
_GC_YOUNG_THRESHOLD = 3000


async def freeze_startup_objects(app: web.Application) -> None:
    """Move everything allocated during start-up (modules, app, registries) out of the garbage
    collector's reach, so its full collections only scan what requests allocate; and collect
    the young generation less often (see `_GC_YOUNG_THRESHOLD`)."""
    gc.collect()
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(young, _GC_YOUNG_THRESHOLD), older, oldest)


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop
