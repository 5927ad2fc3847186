"""The conditions a request met that the client states: its temperature and its category.

Pure: the forwarder reads both from what it parsed already (the JSON body, the headers) and the
record carries them (`records.RequestRecord.temperature`, `.category`), for the conditional
speedups (`stats.segments`). Neither ever changes what is forwarded.

A category is a label the client controls, so it is bounded twice: a value is at most
`CATEGORY_MAX_CHARS` characters of `[a-z0-9._-]` (case folded), else it is `OTHER`; and one
process keeps the first `SegmentsConfig.categories_max` distinct values it sees, every later one
is `OTHER`. A request without the header has no category (None).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = ["CATEGORY_MAX_CHARS", "OTHER", "Categories", "temperature_of"]

CATEGORY_MAX_CHARS: Final = 32
OTHER: Final = "other"
_CATEGORY: Final = re.compile(rf"[a-z0-9._-]{{1,{CATEGORY_MAX_CHARS}}}")


def temperature_of(doc: Mapping[str, Any]) -> float | None:
    """The body's `temperature` when it is a finite number >= 0; None when it is absent (the
    engine's default applies, 1.0 for vLLM unless the model's generation config says otherwise)
    or not a usable number (the engine answers such a request with its own 400)."""
    value = doc.get("temperature")
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    t = float(value)
    return t if math.isfinite(t) and t >= 0 else None


class Categories:
    """The bounded categories of one process: the first `limit` valid values, then `OTHER`."""

    __slots__ = ("_kept", "_limit")

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._kept: set[str] = set()

    def of(self, raw: str | None) -> str | None:
        """The category a header value stands for (None: no header)."""
        if raw is None:
            return None
        value = raw.strip().lower()
        if value == OTHER or not _CATEGORY.fullmatch(value):
            return OTHER
        kept = self._kept
        if value in kept:
            return value
        if len(kept) >= self._limit:
            return OTHER
        kept.add(value)
        return value

    @property
    def kept(self) -> frozenset[str]:
        return frozenset(self._kept)
