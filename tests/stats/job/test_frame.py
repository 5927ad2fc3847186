"""Windows over summaries: the units each window spans, each arm's samples, warm-up units and
segments; the same for the store's minute tiers and for rows' finer units."""

from __future__ import annotations

import numpy as np

from specproxy.stats.job.cache import ArmTier, FineMinute
from specproxy.stats.job.frame import Frame, Tiers, WindowPlan, arm_window, segments_by_label
from specproxy.summary.blocks import Block
from specproxy.summary.grid import COARSE_ERROR_BOUND, GRID_ERROR_BOUND
from specproxy.summary.histogram import coarse_as_fine, coarse_bin
from specproxy.summary.minute import ROLLUP_METRICS


def _tiers(tier: ArmTier, unit_s: float = 60.0) -> Tiers:
    return Tiers(
        unit_s,
        {metric: {arm: tier for arm in ("speculative", "baseline")} for metric in ROLLUP_METRICS},
    )


def test_window_entries_are_every_occupied_bin_of_the_chosen_blocks_and_fine_units() -> None:
    """A window's sample against a plain per-bin loop: blocks with empty dense bins, an empty
    block, a block holding an excluded unit, a fine unit with a zero count; entries in block
    order then fine order, each coarse bin at its centre fine bin."""
    rng = np.random.default_rng(5)
    tier = ArmTier()
    hour = 600  # minute of an hour boundary
    for start, width in ((hour, 60), (hour + 60, 1), (hour + 61, 1), (hour + 62, 1)):
        k = 0 if start == hour + 61 else int(rng.integers(3, 9))
        counts = rng.integers(0, 3, k)  # zeros inside: empty coarse bins
        n = np.zeros(width, dtype=np.int64)
        n[0] = int(counts.sum())
        tier.blocks[(start, width, "m")] = Block(
            start,
            width,
            n,
            n.astype(np.float64),
            n.astype(np.float64),
            int(rng.integers(-40, 40)),
            counts,
        )
    tier.fine[(hour + 63, "m")] = FineMinute(3, 3.0, 3.0, np.array([-7, 2, 9]), np.array([1, 0, 2]))
    tier.fine[(hour + 64, "m")] = FineMinute(1, 1.0, 1.0, np.array([40]), np.array([1]))
    plan = WindowPlan(None, hour, hour + 64, 60.0, hourly=True, coarse=True)
    window = arm_window(_tiers(tier), plan, "baseline", {hour + 62}, None)
    sample = window.samples["e2e"]
    want_unit, want_bin, want_count = [], [], []
    for (start, _w, _m), b in tier.blocks.items():
        if start == hour + 62:
            continue  # holds an excluded unit: left out whole
        for i, c in enumerate(b.counts.tolist()):
            if c:
                want_unit.append(start - hour)
                want_bin.append(int(coarse_as_fine(np.array([b.lo + i]))[0]))
                want_count.append(c)
    for (minute, _m), f in tier.fine.items():
        for b, c in zip(f.bins.tolist(), f.counts.tolist(), strict=True):
            if c:
                want_unit.append(minute - hour)
                want_bin.append(int(coarse_as_fine(coarse_bin(np.array([b])))[0]))
                want_count.append(c)
    assert sample.unit.tolist() == want_unit
    assert sample.bins.tolist() == want_bin
    assert sample.counts.tolist() == want_count
    dropped = tier.blocks[(hour + 62, 1, "m")].n
    assert window.excluded_warmup == dropped
    assert sample.n == sum(b.n for b in tier.blocks.values()) + 4 - dropped
    assert sample.piece_units == 60 and sample.grid_error == COARSE_ERROR_BOUND
    assert sample.series is not None  # the hour blocks' per-unit log of the mean


def test_a_window_reaching_hour_blocks_is_widened_to_whole_hours() -> None:
    tier = ArmTier()
    n = np.ones(60, dtype=np.int64)
    f = n.astype(np.float64)
    tier.blocks[(600, 60, "m")] = Block(600, 60, n, f, f, 10, np.array([60]))
    tier.fine[(700, "m")] = FineMinute(1, 1.0, 1.0, np.array([5]), np.array([1]))
    tiers = _tiers(tier)
    frame = Frame.of(tiers, 700 * 60.0 + 30, now=0.0)
    whole = frame.plan(tiers, None)
    assert (whole.lo, whole.hi, whole.hourly, whole.coarse) == (600, 700, True, True)
    # a 40-minute window from minute 660 reaches no block: minutes, fine grid
    recent = frame.plan(tiers, 40 * 60.0)
    assert (recent.lo, recent.hi, recent.hourly, recent.coarse) == (660, 700, False, False)
    assert recent.grid_error == GRID_ERROR_BOUND
    # a 90-minute window from minute 610 starts inside the hour block: widened to its start
    hourly = frame.plan(tiers, 90 * 60.0)
    assert (hourly.lo, hourly.hi, hourly.hourly) == (600, 700, True)
    assert hourly.span == (600 * 60.0, 701 * 60.0)


def test_segments_gather_the_keys_their_label_maps_to() -> None:
    tier = ArmTier()
    for unit, key in ((1000, "a"), (1001, "b"), (1002, "junk")):
        tier.fine[(unit, key)] = FineMinute(1, 1.0, 1.0, np.array([5]), np.array([1]))
    tiers = _tiers(tier)
    assert segments_by_label(tiers, None) == {k: frozenset({k}) for k in ("a", "b", "junk")}
    bounded = segments_by_label(tiers, lambda m: m if m in ("a", "b") else "other")
    assert bounded == {"a": frozenset({"a"}), "b": frozenset({"b"}), "other": frozenset({"junk"})}
    plan = WindowPlan(None, 1000, 1002, 60.0, hourly=False, coarse=False)
    both = arm_window(tiers, plan, "baseline", set(), bounded["a"] | bounded["other"])
    assert both.samples["e2e"].n == 2 and both.samples["e2e"].unit.tolist() == [0, 2]


def test_units_after_the_limit_are_future_in_no_window_and_set_no_horizon() -> None:
    """Minutes 1000-1004 hold the run; minute 1180 (3 h ahead) a fast replica's requests. The
    limit (now + the skew allowance) leaves minute 1180 out of the horizon and every window,
    counted per arm; a window end after the limit is brought back to it."""
    tier = ArmTier()
    for unit in range(1000, 1005):
        tier.fine[(unit, "m")] = FineMinute(2, 2.0, 2.0, np.array([5]), np.array([2]))
    tier.fine[(1180, "m")] = FineMinute(3, 3.0, 3.0, np.array([5]), np.array([3]))
    tiers = _tiers(tier)
    now = 1005 * 60.0
    frame = Frame.of(tiers, None, now, limit=now + 5.0)
    assert (frame.window_end, frame.horizon) == (now, now)
    assert (frame.first_unit, frame.last_unit) == (1000, 1005)
    assert (frame.future, frame.future_end) == (6, 1181 * 60.0)  # 3 requests on each arm
    for window_s in (300.0, 3600.0, None):
        plan = frame.plan(tiers, window_s)
        assert plan.hi == 1005
        assert arm_window(tiers, plan, "baseline", set(), None).samples["e2e"].n == 10
    late_end = Frame.of(tiers, 1181 * 60.0, now, limit=now + 5.0)
    assert late_end.window_end == now + 5.0 and late_end.horizon == now
    # without a limit (as before the bound) the windows end 3 h ahead, with the future minute
    unbounded = Frame.of(tiers, None, now)
    assert unbounded.window_end == 1181 * 60.0 and unbounded.future == 0
    whole = unbounded.plan(tiers, None)
    assert arm_window(tiers, whole, "baseline", set(), None).samples["e2e"].n == 13
    assert (
        arm_window(tiers, unbounded.plan(tiers, 300.0), "baseline", set(), None).samples["e2e"].n
        == 3
    )
