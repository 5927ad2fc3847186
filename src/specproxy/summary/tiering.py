"""Which tier holds a minute's rollups: the bounds of a compaction pass (pure).

A pass at time `now` folds the fine rows of minutes before `fine_before` into blocks: the
1-minute block of their minute, or, before `hours_before` (whole hours), the hour block holding
it; 1-minute blocks that start before `hours_before` are folded into their hour block too
(`summary.compaction.fold`). The bounds come from `StoreConfig.rollup_fine_minutes` and
`rollup_minute_hours`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from specproxy.summary.minute import ROLLUP_UNIT_S

__all__ = ["HOUR_SPAN", "MINUTE_SPAN", "CompactionBounds"]

MINUTE_SPAN: Final = 1  # closed minutes compacted from the fine rows
HOUR_SPAN: Final = 60  # old minute blocks merged per clock hour (start % 60 == 0)


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
