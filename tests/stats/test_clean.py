"""Warm-up exclusion (the rule shared by the stats job and the report) and outlier counting."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.config import ScrapeConfig, StatsConfig
from specproxy.records import Arm, EngineSample
from specproxy.stats.clean import count_outliers, restart_times, warmup_exclusion, warmup_mask

SPEC = Arm.SPECULATIVE


def sample(
    t: float,
    *,
    up: bool = True,
    restarted: bool = False,
    start: float | None = None,
    arm: Arm = SPEC,
) -> EngineSample:
    return EngineSample(
        t=t, run_id="r", arm=arm, up=up, restarted=restarted, process_start_time=start
    )


def test_warmup_excludes_first_requests_after_start_and_each_restart() -> None:
    t = np.arange(20, dtype=np.float64)
    mask = warmup_mask(t, [10.5], warmup_requests=3, restart_requests=2)
    assert np.flatnonzero(mask).tolist() == [0, 1, 2, 11, 12]


def test_warmup_seconds_after_restart() -> None:
    t = np.arange(20, dtype=np.float64)
    mask = warmup_mask(t, [5.0], warmup_requests=0, restart_requests=1, restart_seconds=3.5)
    assert np.flatnonzero(mask).tolist() == [5, 6, 7, 8]


def test_restart_window_is_the_union_of_request_and_second_limits() -> None:
    t = np.arange(0.0, 20.0)  # one request per second, t = 0..19
    mask = warmup_mask(t, [5.5], warmup_requests=0, restart_requests=3, restart_seconds=5.0)
    # Seconds: 5.5 <= t < 10.5 -> 6..10; requests: the first 3 after 5.5 -> 6, 7, 8.
    assert np.flatnonzero(mask).tolist() == [6, 7, 8, 9, 10]
    mask = warmup_mask(t, [5.5], warmup_requests=0, restart_requests=8, restart_seconds=1.0)
    assert np.flatnonzero(mask).tolist() == list(range(6, 14))


def test_unsorted_input_and_several_restarts() -> None:
    t = np.array([12.0, 1.0, 11.0, 2.0, 30.0, 3.0])
    mask = warmup_mask(t, [0.5, 10.0], warmup_requests=0, restart_requests=1)
    assert mask.tolist() == [False, True, True, False, False, False]


def test_no_restart_no_warmup_no_exclusion() -> None:
    mask = warmup_mask(np.arange(5.0), [], warmup_requests=0, restart_seconds=10.0)
    assert not mask.any()
    assert not warmup_mask(np.array([]), [1.0], warmup_requests=3).any()


def test_failed_requests_do_not_use_up_warmup_slots() -> None:
    t = np.arange(10.0)
    usable = np.array([False, True, True, False, False, True, True, True, True, True])
    # Start: the first 2 usable (1, 2); restart at 2.5: the next 2 usable (5, 6), not the 502s.
    mask = warmup_mask(t, [2.5], usable=usable, warmup_requests=2)
    assert np.flatnonzero(mask).tolist() == [1, 2, 5, 6]
    # Unusable records are never warm-up, even inside the seconds limit.
    mask = warmup_mask(t, [2.5], usable=usable, warmup_requests=0, restart_seconds=4.0)
    assert np.flatnonzero(mask).tolist() == [5, 6]


def test_restart_dated_at_process_start_between_scrapes_else_previous_scrape() -> None:
    samples = [
        sample(10, start=1.0),
        sample(15, start=1.0),
        sample(20, restarted=True, start=17.0),  # start inside (15, 20]: trusted
        sample(25, start=17.0),
        sample(30, restarted=True, start=17.0),  # counter reset only: previous scrape time
        sample(31, restarted=True, arm=Arm.BASELINE),  # another arm: ignored
        sample(35, restarted=True, start=40.0),  # start after the scrape: implausible
    ]
    assert restart_times(samples, SPEC) == [17.0, 25.0, 30.0]
    assert restart_times(samples, Arm.BASELINE) == [31.0]  # nothing before it: its own time


def test_restart_after_failed_scrapes_never_opens_before_the_first_failure() -> None:
    # vLLM's process start time reads up to ~1 s early: here 19.4, before the arm was even
    # found down at 19.5; the new engine cannot have served before that failed scrape.
    samples = [
        sample(19.0, start=1.0),
        sample(19.5, up=False),
        sample(20.0, up=False),
        sample(22.0, restarted=True, start=19.4),
    ]
    assert restart_times(samples, SPEC) == [19.5]
    # A process start after the first failure is kept; one after the scrape is capped at it.
    samples[-1] = sample(22.0, restarted=True, start=21.0)
    assert restart_times(samples, SPEC) == [21.0]
    samples[-1] = sample(22.0, restarted=True, start=23.0)
    assert restart_times(samples, SPEC) == [22.0]
    samples[-1] = sample(22.0, restarted=True)  # no start time: the first failed scrape
    assert restart_times(samples, SPEC) == [19.5]
    # A later restart without failures in between follows the ordinary rule again.
    samples += [sample(25.0, start=21.0), sample(30.0, restarted=True, start=27.0)]
    assert restart_times(samples, SPEC) == [19.5, 27.0]


def _arrays(t: list[float], status: list[int]) -> dict[str, npt.NDArray[Any]]:
    n = len(t)
    return {
        "t_start": np.array(t, dtype=np.float64),
        "status": np.array(status, dtype=np.float64),
        "error_kind": np.array([None if s == 200 else "connect" for s in status], dtype=object),
        "disconnected": np.zeros(n, dtype=bool),
    }


def test_warmup_exclusion_applies_both_configs_and_the_restart_rule() -> None:
    # Two served, the arm goes down (502s at 20.1, 20.6), is found down at 20.2, comes back with
    # a start time of 19.9 (early clock): the two requests before the stop stay in.
    arrays = _arrays(
        [18.0, 19.95, 20.1, 20.6, 22.5, 23.0, 23.5, 24.0, 24.5],
        [200, 200, 502, 502, 200, 200, 200, 200, 200],
    )
    samples = [
        sample(19.0, start=1.0),
        sample(20.2, up=False),
        sample(22.0, restarted=True, start=19.9),
        sample(21.0, arm=Arm.BASELINE),
    ]
    mask = warmup_exclusion(
        arrays,
        samples,
        SPEC,
        stats_cfg=StatsConfig(warmup_requests=1),
        scrape_cfg=ScrapeConfig(warmup_requests=2, warmup_seconds=0.0),
    )
    assert np.flatnonzero(mask).tolist() == [0, 4, 5]
    mask = warmup_exclusion(
        arrays,
        samples,
        SPEC,
        stats_cfg=StatsConfig(warmup_requests=0),
        scrape_cfg=ScrapeConfig(warmup_requests=0, warmup_seconds=3.5),
    )
    assert np.flatnonzero(mask).tolist() == [4, 5, 6]  # 20.2 <= t < 23.7, usable only


def test_outliers_are_counted_with_log_iqr_fences() -> None:
    x = np.concatenate([np.full(50, 1.0), np.full(50, 2.0), [100.0, 0.001]])
    out = count_outliers(x)
    assert out.count == 2
    assert out.fraction == 2 / 102
    assert out.low_fence < 1.0 < 2.0 < out.high_fence < 100.0
    assert count_outliers(np.ones(3)).count == 0
