"""The crossover load: the isotonic fit, its crossing, and coverage against the emulator's model."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest

from specproxy.emulator.model import (
    Physics,
    closed_loop,
    crossover_concurrency,
    steady_state,
    tpot_of,
)
from specproxy.stats.estimate import crossover as crossover_module
from specproxy.stats.estimate.crossover import (
    LoadSample,
    binned_log_error,
    crossover,
    decreasing_fit,
    first_crossing,
)
from specproxy.stats.sample import ArmSample
from specproxy.summary.grid import COARSE_ERROR_BOUND
from specproxy.summary.histogram import coarse_as_fine, coarse_bin

# The emulator's physics of the study (docs/statistics.md): the default roofline, k = 4, no
# acceptance spread and no warm-up, so each level's steady state is the model's and nothing else.
SPECULATIVE = Physics(speculative=True, acceptance=0.7, acceptance_spread=0.0, warmup_requests=0)
BASELINE = Physics(warmup_requests=0)
LEVELS = (1, 2, 4, 8, 12, 16, 20, 22, 24, 26, 28, 30, 32, 36, 40)
MAX_TOKENS = 64


EmulatedRows = dict[bool, list[tuple[float, float, float]]]  # speculative -> (t, level, TPOT)


def emulated_rows(
    seed: int,
    *,
    levels: tuple[int, ...] = LEVELS,
    rounds: int = 3,
    requests: int = 200,
) -> tuple[EmulatedRows, float]:
    """Both arms through the emulator's engine on one virtual clock: `rounds` passes over the
    closed-loop levels, one level after another (both arms from the same start), each request
    with its arrival, its level (its calls in flight when sent) and its steady-state TPOT; and
    the run's span. Load changes over the run as traffic does over a day: each level recurs,
    so resampling time blocks keeps every level."""
    rows: EmulatedRows = {True: [], False: []}
    start = 0.0
    for i, level in enumerate(levels * rounds):
        end = start
        for spec, physics in ((True, SPECULATIVE), (False, BASELINE)):
            done, _ = closed_loop(
                physics,
                concurrency=level,
                requests=requests + 3 * level,
                max_tokens=MAX_TOKENS,
                seed=seed * 100_000 + i * 2 + spec,
                start=start,
            )
            for s in steady_state(done, level):
                tpot = tpot_of(s)
                if tpot is not None:
                    rows[spec].append((s.arrival, float(level), tpot))
            end = max(end, max(s.finished_at or start for s in done))
        start = end
    return rows, start


def emulated_window(seed: int, *, units: int = 200, **kwargs: Any) -> tuple[LoadSample, LoadSample]:
    """`emulated_rows` as each arm's requests, in time units of span / `units`."""
    rows, span = emulated_rows(seed, **kwargs)
    unit_s = span / units

    def sample(spec: bool) -> LoadSample:
        t, load, value = (np.array(c) for c in zip(*rows[spec], strict=True))
        unit = np.minimum(np.floor(t / unit_s).astype(np.int64), units - 1)
        return LoadSample.of(load, unit, value)

    return sample(False), sample(True)


def test_decreasing_fit_pools_violators_by_weight() -> None:
    y = np.array([3.0, 1.0, 2.0, 0.0])
    fit = decreasing_fit(y, np.array([1.0, 1.0, 3.0, 1.0]))
    assert fit.tolist() == pytest.approx([3.0, 1.75, 1.75, 0.0])
    assert decreasing_fit(np.array([1.0, 2.0]), np.ones(2)).tolist() == [1.5, 1.5]


def test_first_crossing_interpolates_or_says_beyond() -> None:
    x = np.array([1.0, 2.0, 4.0])
    assert first_crossing(x, np.array([0.4, 0.2, -0.2])) == pytest.approx(3.0)
    assert first_crossing(x, np.array([0.4, 0.2, 0.1])) == math.inf
    assert first_crossing(x, np.array([0.0, -0.2, -0.4])) == -math.inf


def _known(speedup_at: dict[int, float], n: int, seed: int) -> tuple[LoadSample, LoadSample]:
    """Lognormal latencies (sd 0.3) per load, the treatment faster by `speedup_at[load]`."""
    rng = np.random.default_rng(seed)
    arms = []
    for faster in (False, True):
        load = np.repeat(list(speedup_at), n).astype(np.float64)
        scale = np.array([speedup_at[int(x)] if faster else 1.0 for x in load])
        value = np.exp(rng.normal(0.0, 0.3, load.size)) / scale
        arms.append(LoadSample.of(load, rng.integers(0, 100, load.size), value))
    return arms[0], arms[1]


def test_a_known_crossing_is_found_with_the_speedups_either_side() -> None:
    c, t = _known({1: 1.5, 2: 1.5, 4: 1.2, 8: 0.9, 16: 0.9}, 400, seed=1)
    found = crossover(c, t, units=100, rng=np.random.default_rng(0), resamples=400)
    assert found.status == "ok" and found.load is not None
    assert 4 < found.load < 8
    assert found.lower is not None and found.upper is not None
    assert found.lower <= found.load <= found.upper
    assert found.below == pytest.approx(1.4, rel=0.05)  # loads 1, 2 and 4
    assert found.above == pytest.approx(0.9, rel=0.05)
    assert [g[2] for g in found.groups] == [400] * 5


def test_no_crossing_in_range_is_said_not_made_up() -> None:
    c, t = _known({1: 1.6, 4: 1.4, 16: 1.2}, 300, seed=2)
    found = crossover(c, t, units=100, rng=np.random.default_rng(0), resamples=300)
    assert found.status == "helps_throughout" and found.load is None
    assert found.upper is None  # every replicate stays above 1 as well
    slower = crossover(t, c, units=100, rng=np.random.default_rng(0), resamples=300)
    assert slower.status == "costs_throughout" and slower.lower is None


def test_too_few_requests_for_two_groups_is_too_little_data() -> None:
    c, t = _known({1: 1.5, 2: 0.8}, 10, seed=3)
    found = crossover(c, t, units=100, rng=np.random.default_rng(0), min_group=30)
    assert found.status == "too_little_data" and found.load is None


@pytest.fixture(scope="module")
def true_crossover() -> float:
    found = crossover_concurrency(
        SPECULATIVE, BASELINE, low=1, high=64, requests=4000, max_tokens=MAX_TOKENS
    )
    assert found is not None
    return found


@pytest.mark.slow
def test_the_interval_holds_the_emulator_crossover_in_nine_of_ten_runs(
    true_crossover: float,
) -> None:
    """Done means of issue 26 item 3: on the emulator's own (virtual-clock) timings, the CI of
    the crossover contains the model's true crossover in >= 9 of 10 runs."""
    hits = 0
    for run in range(10):
        control, treatment = emulated_window(run)
        found = crossover(
            control, treatment, units=200, rng=np.random.default_rng(run), resamples=500
        )
        assert found.status == "ok"
        lo = found.lower if found.lower is not None else -math.inf
        hi = found.upper if found.upper is not None else math.inf
        hits += lo <= true_crossover <= hi
    assert hits >= 9


def binned(arm: LoadSample, units: int, *, coarse: bool) -> tuple[LoadSample, ArmSample]:
    """The arm's requests as summaries give them: a sample per load (`ArmSample`, the one
    sample form; `coarse`: on the compacted grid, as condition rollups are), read back as the
    crossover's cells, and the last sample (its grid)."""
    parts = []
    sample = ArmSample.empty(units)
    for load in np.unique(arm.load).tolist():
        at = arm.load == load
        sample = ArmSample.from_values(np.exp(arm.log_sum[at]), arm.unit[at], units)
        if coarse:
            sample = dataclasses.replace(
                sample, bins=coarse_as_fine(coarse_bin(sample.bins)), grid_error=COARSE_ERROR_BOUND
            )
        parts.append(LoadSample.of_sample(load, sample))
    return LoadSample.joined(parts), sample


def test_cells_of_per_load_samples_give_the_requests_crossover_within_the_grid() -> None:
    c, t = _known({1: 1.5, 2: 1.5, 4: 1.2, 8: 0.9, 16: 0.9}, 400, seed=1)
    exact = crossover(c, t, units=100, rng=np.random.default_rng(0), resamples=200)
    (bc, _), (bt, _) = binned(c, 100, coarse=False), binned(t, 100, coarse=False)
    assert bc.n.sum() == c.n.sum() and bt.unit.size < t.unit.size  # a cell per load and unit
    found = crossover(bc, bt, units=100, rng=np.random.default_rng(0), resamples=200)
    assert found.status == exact.status == "ok"
    assert found.load == pytest.approx(exact.load, rel=1e-3)
    assert [g[0] for g in found.groups] == [g[0] for g in exact.groups]


def test_coarse_cells_widen_the_interval_to_hold_the_exact_values_one() -> None:
    """Values at their coarse bins' centres move each group's mean log by up to half a bin: the
    interval from such cells, widened by the grid's bound, holds the one from the exact values
    (the same replicates: the same seed and blocks), whichever way the bins moved them."""
    for run in range(3):
        control, treatment = emulated_window(run)
        exact = crossover(
            control, treatment, units=200, rng=np.random.default_rng(run), block_units=4
        )
        (bc, probe), (bt, _) = (
            binned(control, 200, coarse=True),
            binned(treatment, 200, coarse=True),
        )
        assert binned_log_error(probe) == pytest.approx(math.log1p(COARSE_ERROR_BOUND) / 2)
        wide = crossover(
            bc,
            bt,
            units=200,
            rng=np.random.default_rng(run),
            block_units=4,
            log_error=binned_log_error(probe),
        )
        assert exact.lower is not None and exact.upper is not None
        assert wide.lower is not None and wide.upper is not None
        assert wide.lower <= exact.lower and exact.upper <= wide.upper, run


def test_a_key_s_width_moves_each_bound_out_and_hour_pieces_are_whole_blocks() -> None:
    c, t = _known({1: 1.5, 2: 1.5, 4: 1.2, 8: 0.9, 16: 0.9}, 400, seed=1)
    plain = crossover(c, t, units=100, rng=np.random.default_rng(0), resamples=200)
    wide = crossover(
        c, t, units=100, rng=np.random.default_rng(0), resamples=200, load_error=lambda x: 0.5
    )
    assert plain.lower is not None and plain.upper is not None
    assert wide.lower == pytest.approx(plain.lower - 0.5)
    assert wide.upper == pytest.approx(plain.upper + 0.5)
    hourly = crossover(c, t, units=100, rng=np.random.default_rng(0), resamples=200, piece_units=20)
    assert hourly.block_units % 20 == 0 and hourly.status == "ok"


def test_a_group_of_few_blocks_has_its_replicates_spread_by_the_small_sample_factor() -> None:
    """A group's k resampled blocks understate its spread as they do a block interval's
    (`blockboot`): sqrt(k / (k - 1)) t_(k-1) / z; 1 for a single block, near 1 for many."""
    factor = crossover_module._expansion(np.array([1, 3, 10, 1000]), 0.95)
    assert factor[0] == 1.0
    assert factor[1] == pytest.approx(math.sqrt(1.5) * 4.302653 / 1.959964, rel=1e-5)
    assert factor[2] == pytest.approx(math.sqrt(10 / 9) * 2.262157 / 1.959964, rel=1e-5)
    assert 1.0 < factor[3] < 1.002


def test_the_crossover_interval_is_widened_where_groups_hold_few_blocks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each load spans three time blocks: the interval is wider than the plain percentile one
    (the same replicates with no expansion), around the same estimate."""
    c, t = _known({1: 1.5, 2: 1.5, 4: 1.2, 8: 0.9, 16: 0.9}, 400, seed=1)

    def three_blocks(arm: LoadSample) -> LoadSample:
        level = np.searchsorted(np.unique(arm.load), arm.load)
        return dataclasses.replace(arm, unit=level * 3 + arm.unit % 3)

    c, t = three_blocks(c), three_blocks(t)
    kwargs: dict[str, Any] = {"units": 15, "resamples": 400, "block_units": 1}
    wide = crossover(c, t, rng=np.random.default_rng(0), **kwargs)
    monkeypatch.setattr(crossover_module, "_expansion", lambda k, _c: np.ones(k.size))
    plain = crossover(c, t, rng=np.random.default_rng(0), **kwargs)
    assert wide.load == plain.load and wide.load is not None
    assert None not in (wide.lower, wide.upper, plain.lower, plain.upper)
    assert wide.lower < plain.lower and plain.upper < wide.upper  # type: ignore[operator]
