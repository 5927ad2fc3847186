"""The stats job's incremental copy of a run's rollup tiers (blocks and fine minutes).

A cold cache (a new leader, `specproxy stats`) reads every block and fine minute once. A warm one
asks the store only for what changed since its last tick (`store.contract.TierRead`: every key's
`n` comes back, contents only where `n` differs), so a tick reads the few fine minutes still
filling and the blocks compaction touched, not 30 days of history. Because a block's `n` grows
whenever rows are folded in and the listing names every key, the warm cache after a refresh holds
exactly what a cold read of the same snapshot gets (tests/stats/test_rollupcache.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm
from specproxy.store.contract import SummaryReader, TierRead, TierVersions
from specproxy.summary.blocks import Block
from specproxy.summary.minute import STORED_METRICS
from specproxy.summary.packed import fine_bins_arrays

__all__ = ["ArmTier", "FineMinute", "RollupCache"]

IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class FineMinute:
    n: int
    total: float
    total_sq: float
    bins: IntArray  # fine grid
    counts: IntArray


@dataclass(slots=True)
class ArmTier:
    """One arm's rollups of one metric: blocks by (start, span, model), fine minutes by
    (minute, model)."""

    blocks: dict[tuple[int, int, str], Block] = field(default_factory=dict)  # dense counts only
    fine: dict[tuple[int, str], FineMinute] = field(default_factory=dict)

    def minute_counts(self) -> tuple[IntArray, IntArray]:
        """(minute, n) per minute holding requests, from blocks and fine minutes."""
        minutes: list[IntArray] = [np.array([m for m, _ in self.fine], dtype=np.int64)]
        counts: list[IntArray] = [np.array([f.n for f in self.fine.values()], dtype=np.int64)]
        for b in self.blocks.values():
            minutes.append(np.arange(b.start, b.start + b.span, dtype=np.int64))
            counts.append(b.minute_n)
        m = np.concatenate(minutes)
        n = np.concatenate(counts)
        keep = n > 0
        return m[keep], n[keep]

    @property
    def n(self) -> int:
        return sum(b.n for b in self.blocks.values()) + sum(f.n for f in self.fine.values())


class RollupCache:
    """Every metric's and arm's tiers of one run, refreshed incrementally from a store."""

    def __init__(self) -> None:
        # per metric (the compared ones and the conditions'), every arm the run's summaries hold
        # (an arm appears with its first rows)
        self.tiers: dict[str, dict[Arm, ArmTier]] = {metric: {} for metric in STORED_METRICS}
        self.rows_read = 0  # by the last refresh
        # wall seconds spent reading the store and decoding what it returned (a decode overlaps
        # the next read), and in refreshes altogether, over every refresh (cumulative:
        # benchmarks take differences)
        self.read_s = 0.0
        self.decode_s = 0.0
        self.refresh_s = 0.0

    def versions(self, metric: str) -> TierVersions:
        blocks: dict[tuple[int, int, str, str], int] = {}
        fine: dict[tuple[int, str, str], int] = {}
        for arm, tier in self.tiers[metric].items():
            for (start, span, model), block in tier.blocks.items():
                blocks[(start, span, model, arm)] = block.n
            for (minute, model), f in tier.fine.items():
                fine[(minute, model, arm)] = f.n
        return TierVersions(blocks, fine)

    def apply(self, metric: str, read: TierRead) -> None:
        """Bring `metric` to the snapshot `read` describes (read against `versions(metric)`)."""
        old = self.tiers[metric]
        seen = {row[3] for row in read.blocks} | {row[2] for row in read.minutes}
        new = {arm: ArmTier() for arm in sorted(seen | set(old))}
        for start, span, model, arm_name, _n in read.blocks:
            arm = arm_name
            blob = read.blobs.get((start, span, model, arm_name))
            new[arm].blocks[(start, span, model)] = (
                Block.decode(start, blob)
                if blob is not None
                else old[arm].blocks[(start, span, model)]
            )
        read_minutes = {minute for minute, _model, _arm in read.bins}
        for minute, model, arm_name, n, total, total_sq in read.minutes:
            arm = arm_name
            if minute in read_minutes:
                packed = read.bins.get((minute, model, arm_name), ([], []))
                bins, counts = fine_bins_arrays(*packed)
                new[arm].fine[(minute, model)] = FineMinute(
                    int(n), float(total), float(total_sq), bins, counts
                )
            else:
                new[arm].fine[(minute, model)] = old[arm].fine[(minute, model)]
        self.tiers[metric] = new

    async def refresh(
        self,
        store: SummaryReader,
        run_id: str,
        metrics: tuple[str, ...],
        *,
        executor: Executor | None = None,
        go_on: Callable[[dict[str, int]], bool] | None = None,
    ) -> int:
        """Read what changed of `metrics`; return the rows (and blobs) read. Decoding runs on
        `executor` (the stats job's own thread, so the cache's arrays live in its malloc arena;
        None: the loop's default pool), never on the event loop, and overlaps the next metric's
        read (a new leader's first refresh reads ~490k rows and blobs at 30 days x 1k req/s:
        store and decoder work at once on two cores). `go_on`: asked with the first metric's
        requests per arm (`TierRead.requests`) whether to read the others at all, so a caller
        that needs them only for big runs still overlaps the first decode with the next read."""
        loop = asyncio.get_running_loop()
        began = time.perf_counter()
        rows = 0
        decoding: asyncio.Future[float] | None = None
        try:
            for metric in metrics:
                started = time.perf_counter()
                read = await store.read_tiers(
                    run_id=run_id, metric=metric, known=self.versions(metric)
                )
                self.read_s += time.perf_counter() - started
                if decoding is not None:
                    self.decode_s += await decoding
                decoding = loop.run_in_executor(executor, self._timed_apply, metric, read)
                rows += read.rows
                if go_on is not None and metric == metrics[0] and not go_on(read.requests()):
                    break
            if decoding is not None:
                self.decode_s += await decoding
                decoding = None
        finally:
            if decoding is not None:  # a read failed while a decode ran: let it finish first
                await asyncio.gather(decoding, return_exceptions=True)
            self.refresh_s += time.perf_counter() - began
        self.rows_read = rows
        return rows

    def _timed_apply(self, metric: str, read: TierRead) -> float:
        started = time.perf_counter()
        self.apply(metric, read)
        return time.perf_counter() - started
