"""Test helpers of the summary floor: what the stores' additive upserts do, in Python."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specproxy.summary.minute import RollupBatch

__all__ = ["merge_batches"]


def merge_batches(batches: Sequence[RollupBatch]) -> RollupBatch:
    """Add rollup rows with equal keys (what the stores' additive upserts do)."""

    def add(rows: Sequence[tuple[Any, ...]], width: int) -> list[tuple[Any, ...]]:
        acc: dict[tuple[Any, ...], list[Any]] = {}
        for row in rows:
            values = acc.setdefault(row[:width], [0] * (len(row) - width))
            for i, value in enumerate(row[width:]):
                values[i] += value
        return [(*key, *values) for key, values in acc.items()]

    return RollupBatch(
        add([r for b in batches for r in b.summaries], 5),
        add([r for b in batches for r in b.bins], 6),
        add([r for b in batches for r in b.moments], 4),
    )
