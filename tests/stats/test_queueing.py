from __future__ import annotations

import numpy as np
import pytest

from specproxy.stats.diagnosis import QUEUE_GROWTH, QUEUE_MIN_REQUESTS
from specproxy.stats.queueing import latency_growth, thirds_medians
from specproxy.stats.sample import ArmSample, ArmWindow

UNITS = 12  # a one-minute window of 5-second units


def _window(ttft: np.ndarray, tpot: np.ndarray, unit: np.ndarray) -> ArmWindow:
    return ArmWindow(
        {
            "ttft": ArmSample.from_values(ttft, unit, UNITS, 5.0),
            "tpot": ArmSample.from_values(tpot, unit, UNITS, 5.0),
            "e2e": ArmSample.from_values(ttft + 100 * tpot, unit, UNITS, 5.0),
        }
    )


def _arrivals(rate: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Arrival times of a Poisson load over the window, and their units."""
    rng = np.random.default_rng(seed)
    t = np.sort(rng.uniform(0.0, UNITS * 5.0, rng.poisson(rate * UNITS * 5.0)))
    return t, np.floor(t / 5.0).astype(np.int64)


def _stationary(seed: int, n_rate: float = 8.0) -> ArmWindow:
    t, unit = _arrivals(n_rate, seed)
    rng = np.random.default_rng(seed + 1)
    ttft = 0.02 * rng.lognormal(0.0, 0.5, t.size)
    tpot = 0.012 * rng.lognormal(0.0, 0.3, t.size)
    return _window(ttft, tpot, unit)


def test_a_stationary_load_is_not_queueing() -> None:
    # 20 windows of a Poisson load of 8 req/s with lognormal latencies (log-sd 0.5 and 0.3)
    for seed in range(20):
        assert latency_growth({"baseline": _stationary(seed)}) == ()


def test_a_growing_queue_is_found_on_the_arm_that_queues() -> None:
    # the demo: each request waits for every one before it, the wait grows linearly
    t, unit = _arrivals(8.0, 7)
    ttft = 0.2 + 0.25 * t  # 0.2 s at the start, 15 s after a minute
    tpot = np.full(t.size, 0.012)
    found = latency_growth({"speculative": _stationary(3), "baseline": _window(ttft, tpot, unit)})
    assert [(g.arm, g.metric) for g in found] == [("baseline", "TTFT")]
    [growth] = found
    assert growth.ratio > 4 and growth.ratio >= QUEUE_GROWTH  # 12.7 s / 2.7 s
    assert growth.early_s == pytest.approx(2.7, rel=0.2)  # the first third: t ~ 10 s


def test_a_batch_that_keeps_growing_shows_in_tpot() -> None:
    t, unit = _arrivals(8.0, 11)
    tpot = 0.012 * (1.0 + t / 20.0)  # steps slow down as the batch grows: 4x after a minute
    found = latency_growth({"baseline": _window(np.full(t.size, 0.05), tpot, unit)})
    assert [(g.arm, g.metric) for g in found] == [("baseline", "TPOT")]


def test_a_burst_at_the_end_of_the_window_is_not_a_growing_queue() -> None:
    # another process takes the CPU for the last 15 s: 4x slower, but nothing grew before
    t, unit = _arrivals(8.0, 13)
    ttft = np.where(t > 45.0, 0.12, 0.03)
    assert latency_growth({"baseline": _window(ttft, np.full(t.size, 0.012), unit)}) == ()


def test_too_few_requests_or_units_say_nothing() -> None:
    t, unit = _arrivals(8.0, 5)
    rising = 0.2 + 0.25 * t
    few = 3 * QUEUE_MIN_REQUESTS - 10  # under the minimum in at least one third
    window = _window(rising[:few], rising[:few], unit[:few] // 100)  # all in unit 0
    assert thirds_medians(window.sample("ttft")) is None
    sparse = _window(rising[::8], rising[::8], unit[::8])  # ~60 requests: ~20 per third
    assert thirds_medians(sparse.sample("ttft")) is None
    assert latency_growth({"baseline": ArmWindow({})}) == ()
