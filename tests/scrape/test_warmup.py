"""Warm-up windows after engine restarts."""

from __future__ import annotations

import numpy as np

from specproxy.records import Arm, EngineSample
from specproxy.scrape.warmup import restart_times_from_samples, warmup_mask


def test_window_is_the_union_of_request_and_second_limits() -> None:
    t = np.arange(0.0, 20.0)  # one request per second, t = 0..19
    mask = warmup_mask(t, [5.5], warmup_requests=3, warmup_seconds=5.0)
    # Seconds: 5.5 <= t <= 10.5 -> 6..10; requests: the first 3 after 5.5 -> 6, 7, 8.
    assert np.flatnonzero(mask).tolist() == [6, 7, 8, 9, 10]
    mask = warmup_mask(t, [5.5], warmup_requests=8, warmup_seconds=1.0)
    assert np.flatnonzero(mask).tolist() == list(range(6, 14))


def test_unsorted_input_and_several_restarts() -> None:
    t = np.array([12.0, 1.0, 11.0, 2.0, 30.0, 3.0])
    mask = warmup_mask(t, [0.5, 10.0], warmup_requests=1, warmup_seconds=0.0)
    assert mask.tolist() == [False, True, True, False, False, False]


def test_no_restart_no_exclusion() -> None:
    mask = warmup_mask(np.arange(5.0), [], warmup_requests=10, warmup_seconds=10.0)
    assert not mask.any()


def test_restart_times_from_stored_samples() -> None:
    def sample(t: float, restarted: bool = False, start: float | None = None) -> EngineSample:
        return EngineSample(
            t=t,
            run_id="r",
            arm=Arm.SPECULATIVE,
            up=True,
            restarted=restarted,
            process_start_time=start,
        )

    samples = [
        sample(10, start=1.0),
        sample(15, start=1.0),
        sample(20, restarted=True, start=17.0),  # start inside (15, 20]: trusted
        sample(25, start=17.0),
        sample(30, restarted=True, start=17.0),  # counter reset only: previous scrape time
    ]
    assert restart_times_from_samples(samples) == [17.0, 25.0]
