"""Which blocks a rollup compaction pass writes, from the rows it took (the `fold` the stats
leader hands to `SummaryReader.compact`, which runs it inside the pass's one transaction).

The pass takes (DELETE ... RETURNING) the fine rows and 1-minute blocks its bounds say
(`summary.tiering.CompactionBounds`); folding is addition into whatever block is stored (read,
add, write back), so rows that arrive late for a minute already compacted are folded at the next
pass: nothing is lost, nothing counted twice, and a pass with nothing to take writes nothing.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable

import numpy as np

from specproxy.summary.blocks import Block
from specproxy.summary.tiering import HOUR_SPAN, CompactionBounds

__all__ = ["FoldedBlock", "fold"]

# metric, start, span, model, arm
Target = tuple[str, int, int, str, str]
FoldedBlock = tuple[str, int, int, str, str, Block]


def fold(
    *,
    bounds: CompactionBounds,
    minute_blocks: Iterable[tuple[str, int, str, str, bytes]],
    summaries: Iterable[tuple[str, int, str, str, int, float, float]],
    bins: Iterable[tuple[str, int, str, str, int, int]],
    stored: Callable[[Target], bytes | None],
) -> list[FoldedBlock]:
    """The blocks to write: each target's stored block plus everything taken for it; what
    `bounds` drops (the conditions' rollups past their horizon) is taken and not written.

        `minute_blocks` (metric, start, model, arm, blob) are 1-minute blocks taken before
        `hours_before`; `summaries` (metric, minute, model, arm, n, total, total_sq) and `bins`
        (metric, minute, model, arm, bin, count) the fine rows taken; `stored(target)` reads a
        target's block as stored (None: none yet)."""
    parts: dict[Target, list[Block]] = defaultdict(list)
    for metric, start, model, arm, blob in minute_blocks:
        if bounds.dropped(metric, start):
            continue
        hour = start - start % HOUR_SPAN
        parts[(metric, hour, HOUR_SPAN, model, arm)].append(Block.decode(start, blob))
    fine_s: dict[Target, list[tuple[int, int, float, float]]] = defaultdict(list)
    fine_b: dict[Target, list[tuple[int, int, int]]] = defaultdict(list)
    for metric, minute, model, arm, n, total, sq in summaries:
        if bounds.dropped(metric, minute):
            continue
        fine_s[(metric, *bounds.target(minute), model, arm)].append((minute, n, total, sq))
    for metric, minute, model, arm, b, count in bins:
        if bounds.dropped(metric, minute):
            continue
        fine_b[(metric, *bounds.target(minute), model, arm)].append((minute, b, count))
    for target in fine_s.keys() | fine_b.keys():
        sa = np.asarray(fine_s.get(target, []), dtype=np.float64).reshape(-1, 4)
        ba = np.asarray(fine_b.get(target, []), dtype=np.int64).reshape(-1, 3)
        parts[target].append(
            Block.of_fine(
                target[1],
                target[2],
                minute=sa[:, 0].astype(np.int64),
                n=sa[:, 1].astype(np.int64),
                total=sa[:, 2],
                total_sq=sa[:, 3],
                bins=ba[:, 1],
                counts=ba[:, 2],
            )
        )
    out: list[FoldedBlock] = []
    for target, blocks in parts.items():
        metric, start, span, model, arm = target
        old = stored(target)
        if old is not None:
            blocks = [Block.decode(start, old), *blocks]
        out.append((metric, start, span, model, arm, Block.combine(start, span, blocks)))
    return out
