"""Test helpers of the summary floor: what the stores' additive upserts do, in Python, and a
block's histogram as (bin, count) entries."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.summary.blocks import Block
from specproxy.summary.histogram import coarse_as_fine
from specproxy.summary.minute import RollupBatch

__all__ = ["block_entries", "merge_batches"]


def block_entries(block: Block) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(bin, count) of a block's occupied coarse bins, each bin as the fine bin at its centre."""
    nz = np.flatnonzero(block.counts)
    return coarse_as_fine(nz + block.lo), block.counts[nz]


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
