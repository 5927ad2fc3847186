"""Reads the tests make of a store that no caller in src needs: records as arrays, and the fine
rollup rows of a minute range as arrays per arm (what `read_rollups` returned)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm
from specproxy.store.contract import SummaryReader, TierVersions
from specproxy.summary.packed import fine_bins_arrays
from specproxy.summary.rows import ArmArrays, records_to_arrays

__all__ = ["RollupRows", "read_arrays", "read_rollups", "rollup_rows_from"]


async def read_arrays(
    store: SummaryReader,
    *,
    run_id: str,
    columns: Sequence[str],
    since: float | None = None,
    until: float | None = None,
    usable_only: bool = False,
) -> dict[Arm, ArmArrays]:
    """`read_records` as column arrays (`summary.rows`), every arm present."""
    records = await store.read_records(
        run_id=run_id, columns=columns, since=since, until=until, usable_only=usable_only
    )
    return records_to_arrays(columns, records)


@dataclass(frozen=True, slots=True)
class RollupRows:
    """One arm's fine rollups of one metric over a minute range (rows of several models not
    summed)."""

    minute: npt.NDArray[np.int64]
    n: npt.NDArray[np.int64]
    total: npt.NDArray[np.float64]
    total_sq: npt.NDArray[np.float64]
    bin_minute: npt.NDArray[np.int64]
    bins: npt.NDArray[np.int64]
    counts: npt.NDArray[np.int64]


def rollup_rows_from(
    minutes: Sequence[tuple[int, int, float, float]], bins: Sequence[tuple[int, int, int]]
) -> RollupRows:
    """Rows from (minute, n, total, total_sq) and (minute, bin, count) tuples."""
    m = np.asarray(minutes, dtype=np.float64).reshape(-1, 4)
    b = np.asarray(bins, dtype=np.int64).reshape(-1, 3)
    return RollupRows(
        minute=m[:, 0].astype(np.int64),
        n=m[:, 1].astype(np.int64),
        total=m[:, 2].copy(),
        total_sq=m[:, 3].copy(),
        bin_minute=b[:, 0].copy(),
        bins=b[:, 1].copy(),
        counts=b[:, 2].copy(),
    )


async def read_rollups(
    store: SummaryReader,
    *,
    run_id: str,
    metric: str,
    since_minute: int = 0,
    until_minute: int = 2**40,
    model: str | None = None,
) -> dict[Arm, RollupRows]:
    """The fine rollups of `metric` for minutes in [since_minute, until_minute), per arm, from a
    full tier read (so before any compaction: compacted minutes are blocks)."""
    read = await store.read_tiers(run_id=run_id, metric=metric, known=TierVersions())
    out = {}
    for arm in ("speculative", "baseline"):

        def wanted(minute: int, row_model: str, row_arm: str, arm: Arm = arm) -> bool:
            return (
                since_minute <= minute < until_minute
                and row_arm == arm
                and (model is None or row_model == model)
            )

        minutes = [(m, n, t, sq) for m, mo, a, n, t, sq in read.minutes if wanted(m, mo, a)]
        bins = [
            (m, b, c)
            for (m, mo, a), packed in read.bins.items()
            if wanted(m, mo, a)
            for b, c in zip(*(x.tolist() for x in fine_bins_arrays(*packed)), strict=True)
        ]
        out[arm] = rollup_rows_from(minutes, bins)
    return out
