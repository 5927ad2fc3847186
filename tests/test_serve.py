"""`specproxy serve` flags and TOML merge into one validated Config."""

from __future__ import annotations

import argparse
import gc
from pathlib import Path

import pytest
from aiohttp import web

from specproxy import serve
from specproxy.errors import ConfigError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    serve.configure(parser)
    return parser.parse_args(list(argv))


def test_flags_only() -> None:
    cfg = serve.build_config(
        parse(
            "--baseline", "http://b:1", "--speculative", "http://s:2", "--share", "0.25",
            "--mirror", "0.1", "--allow-forced-arm", "--read-timeout", "30", "--no-inject-usage",
        )
    )  # fmt: skip
    assert cfg.baseline_url == "http://b:1" and cfg.speculative_url == "http://s:2"
    assert cfg.routing.speculative_share == 0.25 and cfg.routing.mirror_fraction == 0.1
    assert cfg.routing.allow_forced_arm and cfg.timeouts.read_s == 30
    assert not cfg.inject_usage


def test_flags_override_the_file_section_by_section(tmp_path: Path) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(
        'baseline_url = "http://b:1"\nspeculative_url = "http://s:2"\nport = 9000\n'
        '[routing]\nmode = "sticky"\nspeculative_share = 0.5\n'
    )
    cfg = serve.build_config(parse("--config", str(path), "--share", "0.9"))
    assert cfg.port == 9000
    assert cfg.routing.mode == "sticky" and cfg.routing.speculative_share == 0.9


@pytest.mark.parametrize(
    ("toml", "argv", "message"),
    [
        ("", (), "baseline_url is required"),
        ('baseline_url = "http://b"\nspeculative_url = "http://s"\nbogus = 1\n', (), "bogus"),
        ("not toml [", (), "not valid TOML"),
        ('baseline_url = "http://b"\n', ("--speculative", "ftp://s"), "speculative_url"),
        ('baseline_url = "http://b"\n', ("--speculative", "http://s", "--share", "2"), "share"),
    ],
)
def test_bad_settings_are_clear_errors(
    tmp_path: Path, toml: str, argv: tuple[str, ...], message: str
) -> None:
    path = tmp_path / "proxy.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        serve.build_config(parse("--config", str(path), *argv))


def test_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        serve.build_config(parse("--config", str(tmp_path / "nope.toml")))


async def test_startup_hook_freezes_and_collects_the_young_generation_less_often() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        await serve.freeze_startup_objects(web.Application())
        assert gc.get_threshold() == (3000, 10, 10)
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
        gc.set_threshold(*saved)
