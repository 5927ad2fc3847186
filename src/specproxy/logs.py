"""Logging setup shared by every command: `--log-level` and `--log-format text|json`.

JSON lines carry `time` (Unix seconds), `level`, `logger`, `message` and, when present,
`exc_info`, one object per line, for container log collectors. The demo's live view replaces the
handler with rich's, so log lines print above the live region instead of breaking it
(`use_console`).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["FORMATS", "LEVELS", "JsonFormatter", "setup_logging", "use_console"]

LEVELS = ("debug", "info", "warning", "error")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "time": round(record.created, 6),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    """Root logger to stderr at `level`, as text or JSON lines; replaces earlier handlers."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())


def use_console(console: Console) -> None:
    """Route text logs through `console` (rich), so a live view keeps its rows. JSON stays."""
    from rich.logging import RichHandler

    root = logging.getLogger()
    if any(isinstance(h.formatter, JsonFormatter) for h in root.handlers):
        return
    handler = RichHandler(console=console, show_path=False, rich_tracebacks=False)
    handler.setFormatter(logging.Formatter("%(name)s: %(message)s"))
    root.handlers[:] = [handler]
