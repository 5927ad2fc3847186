"""The command line as a user meets it: version, help with defaults, logging flags, and the
one-line errors of `serve` on a busy port and of read-only commands on a missing store.

Errors are checked through a real subprocess (`python -m specproxy`), as a user sees them."""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from specproxy import __version__
from specproxy.cli import COMMANDS, build_parser
from specproxy.config import StoreConfig
from specproxy.stats.job.settings import command_settings


def specproxy(
    *args: str, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "specproxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd,
        check=False,
    )


def _command_parser(name: str) -> argparse.ArgumentParser:
    parser = build_parser(name)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command: argparse.ArgumentParser = sub.choices[name]
    return command


def test_version() -> None:
    done = specproxy("--version")
    assert done.returncode == 0
    assert done.stdout.strip() == f"specproxy {__version__}"


def test_top_level_help_speaks_to_users() -> None:
    text = build_parser().format_help()
    assert "first steps:" in text and "specproxy demo" in text
    for name in COMMANDS:
        assert name in text


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_shows_its_default(name: str) -> None:
    command = _command_parser(name)
    text = command.format_help()
    for action in command._actions:
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        if action.nargs == 0 or action.default is None:
            continue  # a switch, or an option that is off/unset unless given
        help_text = command._get_formatter()._expand_help(action)  # what --help prints
        assert "default" in help_text, f"{name} {action.option_strings[0]}: {help_text!r}"
    assert "--log-level" in text and "--log-format" in text


@pytest.mark.parametrize("name", list(COMMANDS))
def test_log_flags_on_every_command(name: str) -> None:
    options = {o: a for a in _command_parser(name)._actions for o in a.option_strings}
    assert options["--log-level"].choices == ("debug", "info", "warning", "error")
    assert options["--log-format"].choices == ("text", "json")


def test_read_only_commands_share_the_default_store() -> None:
    for name in ("report", "export"):
        args, _ = _command_parser(name).parse_known_args([])
        assert args.store == StoreConfig().url, name
    # `stats` takes the store of its --config when there is one, else the same default
    args, _ = _command_parser("stats").parse_known_args([])
    settings = command_settings(args.config, store_url=args.store, environ={})
    assert settings.store.url == StoreConfig().url


def test_serve_on_a_busy_port_is_one_error_line_and_exit_2() -> None:
    busy = socket.create_server(("127.0.0.1", 0))
    try:
        port = busy.getsockname()[1]
        done = specproxy(
            "serve",
            "--baseline",
            "http://127.0.0.1:9",
            "--speculative",
            "http://127.0.0.1:9",
            "--store",
            "memory://",
            "--port",
            str(port),
        )
    finally:
        busy.close()
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        f"specproxy: error: cannot listen on 127.0.0.1:{port}: Address already in use"
    ]
    assert "specproxy on http" not in done.stdout + done.stderr


@pytest.mark.parametrize("command", [["stats"], ["report", "--out", "report"], ["export"]])
def test_read_only_commands_never_create_a_missing_store(
    tmp_path: Path, command: list[str]
) -> None:
    db = tmp_path / "nothing-here.db"
    url = f"sqlite:///{db}"
    done = specproxy(*command, "--store", url, cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"specproxy: error: no store at {url}"
    assert not db.exists()
    assert not (tmp_path / "report").exists()


@pytest.mark.parametrize(
    ("url", "hint"),
    [
        ("http://127.0.0.1:1,http://127.0.0.1:2", "urls = ["),
        ("http://127.0.0.1:99999", "(scheme, host, port)"),
        ("http://127.0.0.1:port", "(scheme, host, port)"),
        ("http://:8000", "(scheme, host, port)"),
    ],
)
def test_serve_refuses_a_bad_upstream_url_at_start_up_in_one_line(url: str, hint: str) -> None:
    """Issue 28 item 5: a comma-separated list used to start, then answer every request with a
    bare 500; each upstream URL is now checked (scheme, host, port) before anything starts."""
    done = specproxy(
        "serve",
        "--baseline",
        "http://127.0.0.1:9",
        "--speculative",
        url,
        "--store",
        "memory://",
        "--port",
        "0",
        timeout=60,
    )
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert line.startswith("specproxy: error: speculative_url must be an absolute http(s) URL")
    assert hint in line and url in line


@pytest.mark.parametrize("name", list(COMMANDS))
def test_every_option_has_help_that_states_its_default_once(name: str) -> None:
    """Issue 28 item 5: 16 `emulate` flags had no help, and `serve --read-timeout` printed its
    default twice."""
    command = _command_parser(name)
    for action in command._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        flag = action.option_strings[-1]
        assert action.help, f"{name} {flag} has no help"
        help_text = command._get_formatter()._expand_help(action)
        assert help_text.count("(default") <= 1, f"{name} {flag}: {help_text!r}"
