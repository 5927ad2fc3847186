"""Warm-up: the units each arm leaves out after its start and after every restart, and when a
restart happened (the rule the stats job and the report share)."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm, EngineSample
from specproxy.stats.warmup import WarmupRule, excluded_units, restart_times

SPEC = "speculative"


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


def _units(counts: dict[int, int]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    return np.array(list(counts), dtype=np.int64), np.array(list(counts.values()), dtype=np.int64)


def test_the_units_holding_the_first_requests_are_left_out() -> None:
    per_unit = _units({100: 2, 101: 2, 102: 2, 103: 2})  # usable requests per 1 s unit
    rule = WarmupRule(requests=3, restart_requests=0, restart_seconds=0.0)
    # the first 3 requests lie in units 100 and 101: both whole units go
    assert excluded_units(*per_unit, [], unit_s=1.0, rule=rule) == {100, 101}
    assert excluded_units(*per_unit, [], unit_s=1.0, rule=WarmupRule(0, 0, 0.0)) == set()


def test_after_a_restart_until_both_its_requests_and_its_seconds_have_passed() -> None:
    per_unit = _units({u: 1 for u in range(100, 120)})  # one request a second
    # restart at 105.5: its unit on, the next 3 requests (units 105..107 hold 3 from 105 on)
    rule = WarmupRule(requests=0, restart_requests=3, restart_seconds=0.0)
    assert excluded_units(*per_unit, [105.5], unit_s=1.0, rule=rule) == {105, 106, 107}
    # seconds reach further than requests: the union (105.5 + 5 s lies in unit 110)
    rule = WarmupRule(requests=0, restart_requests=3, restart_seconds=5.0)
    assert excluded_units(*per_unit, [105.5], unit_s=1.0, rule=rule) == set(range(105, 111))
    # requests reach further than seconds
    rule = WarmupRule(requests=0, restart_requests=8, restart_seconds=1.0)
    assert excluded_units(*per_unit, [105.5], unit_s=1.0, rule=rule) == set(range(105, 113))


def test_minute_units_and_several_restarts() -> None:
    per_unit = _units({1000: 5, 1001: 5, 1002: 5, 1004: 5, 1005: 5, 1006: 5, 1007: 5})
    rule = WarmupRule(requests=7, restart_requests=6, restart_seconds=0.0)
    restarts = [1004 * 60 + 10.0, 1007 * 60 + 59.0]
    got = excluded_units(*per_unit, restarts, unit_s=60.0, rule=rule)
    # the first 7: minutes 1000-1001; the first restart: its minute and the next (6 requests);
    # the second: its minute, the last one holding data
    assert got == {1000, 1001, 1004, 1005, 1007}
    # only usable requests fill slots: a unit with none does not count (1003 is absent above)
    assert excluded_units(*per_unit, [1002 * 60 + 30.0], unit_s=60.0, rule=rule) >= {1002, 1004}


def test_restart_dated_at_process_start_between_scrapes_else_previous_scrape() -> None:
    samples = [
        sample(10, start=1.0),
        sample(15, start=1.0),
        sample(20, restarted=True, start=17.0),  # start inside (15, 20]: trusted
        sample(25, start=17.0),
        sample(30, restarted=True, start=17.0),  # counter reset only: previous scrape time
        sample(31, restarted=True, arm="baseline"),  # another arm: ignored
        sample(35, restarted=True, start=40.0),  # start after the scrape: implausible
    ]
    assert restart_times(samples, SPEC) == [17.0, 25.0, 30.0]
    assert restart_times(samples, "baseline") == [31.0]  # nothing before it: its own time


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
