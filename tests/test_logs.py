"""Logging setup: text or one JSON object per line, and rich's handler for a live view."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest
from rich.console import Console

from specproxy.logs import JsonFormatter, setup_logging, use_console


@pytest.fixture(autouse=True)
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def test_json_lines_carry_level_logger_message(capsys: pytest.CaptureFixture[str]) -> None:
    setup_logging("info", "json")
    logging.getLogger("specproxy.x").info("hello %s", "world")
    logging.getLogger("specproxy.x").debug("hidden")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("specproxy.y").exception("failed")
    lines = capsys.readouterr().err.splitlines()
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert len(records) == 2  # the debug line is below the threshold
    first, second = records
    assert first["level"] == "info" and first["logger"] == "specproxy.x"
    assert first["message"] == "hello world" and isinstance(first["time"], float)
    assert second["level"] == "error" and "ValueError: boom" in second["exc_info"]


def test_level_names_the_threshold() -> None:
    setup_logging("warning", "text")
    assert logging.getLogger().level == logging.WARNING


def test_use_console_routes_text_logs_through_rich() -> None:
    setup_logging("info", "text")
    out = io.StringIO()
    use_console(Console(file=out, width=80, force_terminal=False))
    logging.getLogger("specproxy.demo").info("printed above the live view")
    assert "printed above the live view" in out.getvalue()


def test_use_console_keeps_json_logs_json() -> None:
    setup_logging("info", "json")
    use_console(Console(file=io.StringIO()))
    assert isinstance(logging.getLogger().handlers[0].formatter, JsonFormatter)
