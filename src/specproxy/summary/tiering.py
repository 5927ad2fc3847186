"""Which tier holds a minute's rollups: the bounds of a compaction pass (pure).

A pass at time `now` folds the fine rows of minutes before `fine_before` into blocks: the
1-minute block of their minute, or, before `hours_before` (whole hours), the hour block holding
it; 1-minute blocks that start before `hours_before` are folded into their hour block too
(`summary.compaction.fold`). How long minutes stay fine (`FINE_MINUTES`: windows within it keep
the 0.02 % grid) and when they merge into hours (`MINUTE_HOURS`) are constants: they trade a new
leader's read (~66k fine rows per minute at 1k req/s per arm) against the grid of short windows.

The conditions' rollups (`summary.conditions`: a key per condition a request stated, so several
times the model's rows) are kept `CONDITION_MINUTES` only: a pass drops (takes and does not
fold) their fine rows and 1-minute blocks of minutes before `conditions_before`, so they never
reach the hour tier, and what the stats job holds of them stays bounded however long the run
(the speedups by condition of a run read from its summaries cover that last hour).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final

from specproxy.summary.conditions import CONDITION_METRICS
from specproxy.summary.minute import ROLLUP_UNIT_S

__all__ = [
    "CONDITION_MINUTES",
    "FINE_MINUTES",
    "HOUR_SPAN",
    "MINUTE_HOURS",
    "MINUTE_SPAN",
    "CompactionBounds",
]

MINUTE_SPAN: Final = 1  # closed minutes compacted from the fine rows
HOUR_SPAN: Final = 60  # old minute blocks merged per clock hour (start % 60 == 0)
FINE_MINUTES: Final = 6  # minutes a minute's fine rows are kept (the default 5-minute window)
MINUTE_HOURS: Final = 3.0  # hours 1-minute blocks are kept before they merge into hours
CONDITION_MINUTES: Final = 60  # minutes the conditions' rollups are kept (then dropped)


@dataclass(frozen=True, slots=True)
class CompactionBounds:
    fine_before: int  # fine rows of minutes before this are folded into blocks
    hours_before: int  # a multiple of 60: 1-minute blocks before this go into hour blocks
    # the conditions' rollups of minutes before this are dropped (None: kept as the others)
    conditions_before: int | None = None

    def __post_init__(self) -> None:
        if self.hours_before % HOUR_SPAN or self.hours_before > self.fine_before:
            raise ValueError("hours_before must be whole hours, not after fine_before")
        cut = self.conditions_before
        if cut is not None and not self.hours_before <= cut <= self.fine_before:
            raise ValueError("conditions_before must lie in [hours_before, fine_before]")

    @classmethod
    def at(
        cls,
        now: float,
        *,
        fine_minutes: int = FINE_MINUTES,
        minute_hours: float = MINUTE_HOURS,
        condition_minutes: int = CONDITION_MINUTES,
    ) -> CompactionBounds:
        """The bounds of a pass at Unix time `now` (tests pass other spans)."""
        minute = math.floor(now / ROLLUP_UNIT_S)
        fine = minute - fine_minutes
        hours = min(math.floor((minute - minute_hours * 60) / HOUR_SPAN) * HOUR_SPAN, fine)
        conditions = min(max(minute - condition_minutes, hours), fine)
        return cls(fine_before=fine, hours_before=hours, conditions_before=conditions)

    def blocks_before(self, metric: str) -> int:
        """1-minute blocks of `metric` starting before this are taken by a pass."""
        if metric in CONDITION_METRICS and self.conditions_before is not None:
            return self.conditions_before
        return self.hours_before

    def dropped(self, metric: str, minute: int) -> bool:
        """Whether a pass drops what it took of `metric` at `minute` instead of folding it."""
        cut = self.conditions_before
        return cut is not None and minute < cut and metric in CONDITION_METRICS

    def target(self, minute: int) -> tuple[int, int]:
        """(start, span) of the block a minute's rows are folded into."""
        if minute < self.hours_before:
            return minute - minute % HOUR_SPAN, HOUR_SPAN
        return minute, MINUTE_SPAN
