"""Which blocks the rollup compaction writes, from the rows it took (pure; every backend's
`_compact` runs it inside one transaction).

A pass of the stats leader, for one run, with two bounds (minutes, from `StoreConfig`):
  * `fine_before` = now - `store.rollup_fine_minutes`: fine rows (summaries and bins) of earlier
    minutes are taken (DELETE ... RETURNING) and folded into the 1-minute block of their minute,
    or, for minutes before `hours_before`, into the hour block holding it;
  * `hours_before` = whole hours before now - `store.rollup_minute_hours`: 1-minute blocks that
    start earlier are taken and folded into their hour block.
Folding is addition into whatever block is stored (read, add, write back), so rows that arrive
late for a minute already compacted are folded at the next pass: nothing is lost, nothing counted
twice, and a pass with nothing to take writes nothing.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from specproxy.summary.blocks import HOUR_SPAN, MINUTE_SPAN, Block
from specproxy.summary.minute import ROLLUP_UNIT_S

__all__ = ["CompactionBounds", "FoldedBlock", "fold"]

# metric, start, span, model, arm
Target = tuple[str, int, int, str, str]
FoldedBlock = tuple[str, int, int, str, str, Block]


@dataclass(frozen=True, slots=True)
class CompactionBounds:
    fine_before: int  # fine rows of minutes before this are folded into blocks
    hours_before: int  # a multiple of 60: 1-minute blocks before this go into hour blocks

    def __post_init__(self) -> None:
        if self.hours_before % HOUR_SPAN or self.hours_before > self.fine_before:
            raise ValueError("hours_before must be whole hours, not after fine_before")

    @classmethod
    def at(cls, now: float, *, fine_minutes: int, minute_hours: float) -> CompactionBounds:
        """The bounds of a pass at Unix time `now` (`StoreConfig.rollup_*`)."""
        minute = math.floor(now / ROLLUP_UNIT_S)
        hours = math.floor((minute - minute_hours * 60) / HOUR_SPAN) * HOUR_SPAN
        return cls(
            fine_before=minute - fine_minutes, hours_before=min(hours, minute - fine_minutes)
        )

    def target(self, minute: int) -> tuple[int, int]:
        """(start, span) of the block a minute's rows are folded into."""
        if minute < self.hours_before:
            return minute - minute % HOUR_SPAN, HOUR_SPAN
        return minute, MINUTE_SPAN


def fold(
    *,
    bounds: CompactionBounds,
    minute_blocks: Iterable[tuple[str, int, str, str, bytes]],
    summaries: Iterable[tuple[str, int, str, str, int, float, float]],
    bins: Iterable[tuple[str, int, str, str, int, int]],
    stored: Callable[[Target], bytes | None],
) -> list[FoldedBlock]:
    """The blocks to write: each target's stored block plus everything taken for it.

    `minute_blocks` (metric, start, model, arm, blob) are 1-minute blocks taken before
    `hours_before`; `summaries` (metric, minute, model, arm, n, total, total_sq) and `bins`
    (metric, minute, model, arm, bin, count) the fine rows taken; `stored(target)` reads a
    target's block as stored (None: none yet)."""
    parts: dict[Target, list[Block]] = defaultdict(list)
    for metric, start, model, arm, blob in minute_blocks:
        hour = start - start % HOUR_SPAN
        parts[(metric, hour, HOUR_SPAN, model, arm)].append(Block.decode(start, blob))
    fine_s: dict[Target, list[tuple[int, int, float, float]]] = defaultdict(list)
    fine_b: dict[Target, list[tuple[int, int, int]]] = defaultdict(list)
    for metric, minute, model, arm, n, total, sq in summaries:
        fine_s[(metric, *bounds.target(minute), model, arm)].append((minute, n, total, sq))
    for metric, minute, model, arm, b, count in bins:
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
