"""The bounded `model` label: the model string a client sent, or `other`.

A client can send any string as `model`. Used as a Prometheus label, or as a key of the stats
job's per-model results, that is unbounded cardinality (one series, one result block per typo or
per attack). So the label's values are limited to the models the arms actually serve (their
`/v1/models`, refreshed by the scraper) plus a configured allow-list; anything else is
`OTHER`. The served set is capped too (`max_served`), since it comes from the engines: the
number of distinct label values is at most `len(allow) + max_served + 1`.

Pure: the served models are handed in (`parse_models` reads a `/v1/models` body).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Final

__all__ = ["OTHER", "ModelLabels", "parse_models"]

OTHER: Final = "other"
MAX_SERVED: Final = 64  # distinct served models kept; vLLM serves one name (plus LoRA adapters)


class ModelLabels:
    """Maps a request's model string to a bounded label value."""

    __slots__ = ("_allow", "_known", "_max_served", "_served")

    def __init__(self, allow: Iterable[str] = (), *, max_served: int = MAX_SERVED) -> None:
        self._allow = frozenset(allow)
        self._max_served = max_served
        self._served: frozenset[str] = frozenset()
        self._known = self._allow

    @property
    def bound(self) -> int:
        """The most distinct values `label` can ever return."""
        return len(self._allow) + self._max_served + 1

    @property
    def known(self) -> frozenset[str]:
        """The values that are their own label now."""
        return self._known

    def set_served(self, models: Iterable[str]) -> None:
        """The models the arms serve now (all arms together); replaces the previous set.

        Only the first `max_served` (in sorted order) are kept; a model no arm serves any more
        falls back to `OTHER` from now on.
        """
        served = sorted({m for m in models if m and m != OTHER})[: self._max_served]
        self._served = frozenset(served)
        self._known = self._allow | self._served

    def label(self, model: str | None) -> str:
        """`model` if it is served or allowed, else `OTHER`."""
        return model if model is not None and model in self._known else OTHER


def parse_models(body: bytes | str) -> list[str]:
    """The model ids of an OpenAI `/v1/models` response; [] when the body is not one."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return []
    items = data.get("data") if isinstance(data, dict) else None
    if not isinstance(items, list):
        return []
    return [
        item["id"] for item in items if isinstance(item, dict) and isinstance(item.get("id"), str)
    ]
