"""Compaction targets and folding (pure): where each taken row goes, and that folding adds."""

from __future__ import annotations

import numpy as np
import pytest

from specproxy.summary.blocks import Block
from specproxy.summary.compaction import fold
from specproxy.summary.tiering import CONDITION_MINUTES, CompactionBounds


def test_bounds_keep_fine_minutes_and_whole_hours() -> None:
    now = 10_000 * 60.0 + 30  # minute 10000
    b = CompactionBounds.at(now, fine_minutes=10, minute_hours=3)
    assert b.fine_before == 9990
    assert b.hours_before == 9780  # whole hours at or before minute 10000 - 180
    assert b.target(9989) == (9989, 1)
    assert b.target(9779) == (9720, 60)
    with pytest.raises(ValueError, match="whole hours"):
        CompactionBounds(fine_before=100, hours_before=90)


def test_fold_adds_taken_rows_to_what_is_stored() -> None:
    bounds = CompactionBounds(fine_before=200, hours_before=120)
    one = Block.of_fine(
        70, 1, minute=np.array([70]), n=np.array([1]), total=np.array([1.0]),
        total_sq=np.array([1.0]), bins=np.array([5]), counts=np.array([1]),
    )  # fmt: skip
    folded = fold(
        bounds=bounds,
        minute_blocks=[("e2e", 70, "m", "baseline", one.encode())],  # into the hour block
        summaries=[
            ("e2e", 61, "m", "baseline", 1, 2.0, 4.0),  # into the hour block too
            ("e2e", 150, "m", "baseline", 3, 3.0, 3.0),  # into its own 1-minute block
        ],
        bins=[("e2e", 61, "m", "baseline", 10, 1), ("e2e", 150, "m", "baseline", 50, 3)],
        stored=lambda t: None,
    )
    got = {(m, st, sp, mo, a): b for m, st, sp, mo, a, b in folded}
    assert set(got) == {("e2e", 60, 60, "m", "baseline"), ("e2e", 150, 1, "m", "baseline")}
    hour = got[("e2e", 60, 60, "m", "baseline")]
    assert hour.n == 2 and hour.minute_n[1] == 1 and hour.minute_n[10] == 1
    assert got[("e2e", 150, 1, "m", "baseline")].n == 3
    # with a stored block for the hour, the fold adds to it
    again = fold(
        bounds=bounds,
        minute_blocks=[],
        summaries=[("e2e", 61, "m", "baseline", 1, 2.0, 4.0)],
        bins=[("e2e", 61, "m", "baseline", 10, 1)],
        stored=lambda t: hour.encode() if t == ("e2e", 60, 60, "m", "baseline") else None,
    )
    assert again[0][5].n == 3 and again[0][5].minute_n[1] == 2


def test_the_conditions_rollups_past_their_hour_are_dropped_never_folded_into_hours() -> None:
    now = 10_000 * 60.0 + 30
    b = CompactionBounds.at(now, fine_minutes=10, minute_hours=3)
    assert b.conditions_before == 10_000 - CONDITION_MINUTES
    assert b.blocks_before("e2e") == b.hours_before
    assert b.blocks_before("cond_tpot") == b.conditions_before  # taken sooner than the others
    assert b.dropped("cond_e2e", 9939) and not b.dropped("cond_e2e", 9940)
    assert not b.dropped("e2e", 1)
    with pytest.raises(ValueError, match="conditions_before"):
        CompactionBounds(fine_before=200, hours_before=120, conditions_before=100)
    one = Block.of_fine(
        9900, 1, minute=np.array([9900]), n=np.array([1]), total=np.array([1.0]),
        total_sq=np.array([1.0]), bins=np.array([5]), counts=np.array([1]),
    )  # fmt: skip
    folded = fold(
        bounds=b,
        minute_blocks=[
            ("cond_tpot", 9900, "load=3", "baseline", one.encode()),  # past its hour: dropped
            ("e2e", 9700, "m", "baseline", one.encode()),  # into its hour block
        ],
        summaries=[
            ("cond_tpot", 9930, "load=3", "baseline", 1, 2.0, 4.0),  # dropped
            ("cond_tpot", 9950, "load=3", "baseline", 1, 2.0, 4.0),  # its 1-minute block
        ],
        bins=[
            ("cond_tpot", 9930, "load=3", "baseline", 10, 1),
            ("cond_tpot", 9950, "load=3", "baseline", 10, 1),
        ],
        stored=lambda t: None,
    )
    assert {(m, st, sp) for m, st, sp, *_ in folded} == {("e2e", 9660, 60), ("cond_tpot", 9950, 1)}
