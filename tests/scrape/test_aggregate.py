"""Per-endpoint scrapes -> one arm: deltas per endpoint, summed; churn is no restart."""

from __future__ import annotations

from typing import Any

import pytest

from specproxy.scrape.aggregate import ArmAggregate
from specproxy.scrape.parse import EngineSnapshot, SpecFormat, parse_metrics
from tests.scrape.fakes import EngineCounts, v1_text

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"


def v1(
    t: float,
    drafts: float,
    tokens: float,
    accepted: float,
    gen: float = 0.0,
    start: float | None = 100.0,
    **extra: Any,
) -> EngineSnapshot:
    return EngineSnapshot(
        t=t,
        spec_format=SpecFormat.V1,
        engines=1,
        process_start_time=start,
        num_drafts=drafts,
        num_draft_tokens=tokens,
        num_accepted_tokens=accepted,
        generation_tokens=gen,
        **extra,
    )


def agg() -> ArmAggregate:
    return ArmAggregate("speculative", "r")


def test_acceptance_is_the_ratio_of_summed_deltas() -> None:
    a = agg()
    first = a.update(0.0, {A: v1(0, 1000, 4000, 3000, 5000), B: v1(0, 10, 40, 5, 50)})
    assert first.up and not first.restarted and first.acceptance_rate is None
    # A drafted 100 tokens, 80 accepted; B drafted 300, 60 accepted -> 140/400, not mean(.8,.2)
    s = a.update(10.0, {A: v1(10, 1025, 4100, 3080, 5200), B: v1(10, 85, 340, 65, 150)})
    assert s.acceptance_rate == pytest.approx(140 / 400)
    assert s.mean_acceptance_length == pytest.approx(1 + 140 / 100)
    assert s.generation_tokens_per_s == pytest.approx(200 / 10 + 100 / 10)
    assert not s.restarted and a.restart_times == []


def test_endpoints_with_very_different_totals_do_not_read_as_a_restart() -> None:
    # What a load-balanced Service does to one scrape target: counters jump between pods.
    a = agg()
    a.update(0.0, {A: v1(0, 5000, 20000, 15000), B: v1(0, 10, 40, 30, start=200.0)})
    s = a.update(5.0, {A: v1(5, 5010, 20040, 15030), B: v1(5, 20, 80, 60, start=200.0)})
    assert not s.restarted
    assert s.acceptance_rate == pytest.approx(60 / 80)


def test_a_new_endpoint_is_no_restart_and_adds_no_delta() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 10, 40, 20)})
    s = a.update(5.0, {A: v1(5, 20, 80, 40), C: v1(5, 9000, 36000, 1000, start=50.0)})
    assert not s.restarted and a.restart_times == []
    assert s.acceptance_rate == pytest.approx(20 / 40)  # C's totals are not a delta
    assert set(a.endpoints) == {A, C}


def test_a_vanished_endpoint_is_no_counter_reset() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 10, 40, 20), B: v1(0, 9000, 36000, 30000)})
    s = a.update(5.0, {A: v1(5, 20, 80, 40)})
    assert not s.restarted and a.restart_times == []
    assert s.acceptance_rate == pytest.approx(0.5)
    assert set(a.endpoints) == {A}
    # and when it comes back later, it is new again: no delta, no restart
    s = a.update(10.0, {A: v1(10, 30, 120, 60), B: v1(10, 1, 4, 1, start=999.0)})
    assert not s.restarted and s.acceptance_rate == pytest.approx(0.5)


def test_a_real_restart_of_one_endpoint_is_one_restart_and_its_delta_is_void() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 100, 400, 300), B: v1(0, 100, 400, 100, start=-50.0)})
    s = a.update(10.0, {A: v1(10, 110, 440, 330), B: v1(10, 2, 8, 1, start=7.0)})
    assert s.restarted
    assert a.restart_times == [7.0]
    assert a.endpoints[B].restarts == 1 and a.endpoints[A].restarts == 0
    assert s.acceptance_rate == pytest.approx(30 / 40)  # only A's delta
    assert s.process_start_time == 7.0
    s = a.update(20.0, {A: v1(20, 120, 480, 360), B: v1(20, 12, 48, 11, start=7.0)})
    assert not s.restarted and s.acceptance_rate == pytest.approx(40 / 80)


def test_a_down_endpoint_keeps_the_arm_up_and_dates_its_restart_by_its_failures() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 10, 40, 20), B: v1(0, 10, 40, 20, start=-50.0)})
    s = a.update(10.0, {A: v1(10, 20, 80, 40), B: "refused"})
    assert s.up and s.acceptance_rate == pytest.approx(0.5)
    assert a.endpoints[B].up is False and a.endpoints[B].error == "refused"
    a.update(20.0, {A: v1(20, 30, 120, 60), B: "refused"})
    # B comes back with a start time one second before it first failed: dated at the failure
    s = a.update(30.0, {A: v1(30, 40, 160, 80), B: v1(30, 1, 4, 2, start=9.0)})
    assert s.restarted and a.restart_times == [10.0]
    s = a.update(40.0, {A: v1(40, 40, 160, 80), B: v1(40, 1, 4, 2, start=9.0)})
    assert not s.restarted


def test_every_endpoint_down_is_an_arm_down() -> None:
    a = agg()
    s = a.update(0.0, {A: "timed out", B: "refused"})
    assert not s.up and s.acceptance_rate is None


def test_positions_and_gauges_combine() -> None:
    a = agg()
    a.update(
        0.0,
        {
            A: v1(
                0,
                10,
                20,
                10,
                accepted_per_position=(6.0, 4.0),
                requests_running=2.0,
                kv_cache_usage=0.2,
            ),
            B: v1(
                0,
                10,
                20,
                10,
                accepted_per_position=(5.0,),
                requests_running=3.0,
                kv_cache_usage=0.4,
            ),
        },
    )
    s = a.update(
        5.0,
        {
            A: v1(
                5,
                20,
                40,
                20,
                accepted_per_position=(12.0, 8.0),
                requests_running=1.0,
                kv_cache_usage=0.1,
            ),
            B: v1(
                5,
                30,
                60,
                30,
                accepted_per_position=(15.0, 10.0),
                requests_running=4.0,
                kv_cache_usage=0.3,
            ),
        },
    )
    # drafts: 10 + 20 = 30; position 0: 6 + 10, position 1: 4 + 10 (B exported it late: from 0)
    assert s.position_acceptance == pytest.approx((16 / 30, 14 / 30))
    assert s.requests_running == 5.0
    assert s.kv_cache_usage == pytest.approx(0.2)


def test_baseline_arm_has_no_acceptance() -> None:
    a = ArmAggregate("baseline", "r")
    snap = EngineSnapshot(t=0, spec_format=None, engines=1, generation_tokens=10.0)
    a.update(0.0, {A: snap})
    s = a.update(1.0, {A: EngineSnapshot(t=1, spec_format=None, engines=1, generation_tokens=30.0)})
    assert s.acceptance_rate is None and s.mean_acceptance_length is None
    assert s.generation_tokens_per_s == pytest.approx(20.0)


def test_real_text_through_the_parser() -> None:
    a = agg()
    before = v1_text([EngineCounts(10, 40, 30, (10, 9, 7, 4), 100)], start_time=100.0)
    after = v1_text([EngineCounts(20, 80, 50, (15, 12, 9, 4), 200)], start_time=100.0)
    other = v1_text([EngineCounts(1000, 4000, 100, (50, 30, 15, 5), 9000)], start_time=300.0)
    a.update(0.0, {A: parse_metrics(before, t=0.0), B: parse_metrics(other, t=0.0)})
    s = a.update(5.0, {A: parse_metrics(after, t=5.0), B: parse_metrics(other, t=5.0)})
    assert s.acceptance_rate == pytest.approx(20 / 40)
    assert s.position_acceptance == pytest.approx((5 / 10, 3 / 10, 2 / 10, 0.0))


def test_a_load_balanced_url_is_no_restart_and_measures_each_process_by_itself() -> None:
    a = agg()
    # two engines behind one URL, both running long before the first scrape
    a.update(0.0, {A: v1(0, 100, 400, 300, start=-500.0)})
    s = a.update(10.0, {A: v1(10, 2000, 8000, 1000, start=-900.0)})
    assert not s.restarted and a.restart_times == [] and s.acceptance_rate is None
    assert a.newly_balanced == [A] and a.endpoints[A].balanced
    # each process against its own last scrape: 100 drafts / 400 tokens / 200 accepted
    s = a.update(20.0, {A: v1(20, 200, 800, 500, start=-500.0)})
    assert a.newly_balanced == [] and not s.restarted
    assert s.acceptance_rate == pytest.approx(200 / 400)
    s = a.update(30.0, {A: v1(30, 2010, 8040, 1010, start=-900.0)})
    assert s.acceptance_rate == pytest.approx(10 / 40)
    assert s.generation_tokens_per_s is None  # one engine's rate is not the URL's
    assert a.restart_times == []


def test_a_new_pod_behind_a_balancer_is_one_restart_then_the_old_one_shows_the_balancer() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 100, 400, 300, start=-500.0)})
    s = a.update(10.0, {A: v1(10, 1, 4, 2, start=5.0)})  # started after the last scrape
    assert s.restarted and a.restart_times == [5.0]  # a fresh engine: its warm-up is excluded
    s = a.update(20.0, {A: v1(20, 110, 440, 330, start=-500.0)})  # the old process again
    assert not s.restarted and a.restart_times == [5.0]
    assert a.newly_balanced == [A]


def test_counters_back_and_forth_without_start_times_are_a_balancer_never_a_restart() -> None:
    """Engines that export no process start time (vLLM with --api-server-count > 1) behind one
    URL: only the counters show the balancer, dropping to the other engine's and coming back."""
    a = agg()
    a.update(0.0, {A: v1(0, 1000, 4000, 3000, 9000, start=None)})
    s = a.update(10.0, {A: v1(10, 10, 40, 20, 90, start=None)})  # the other engine's counters
    assert not s.restarted and a.restart_times == [] and s.acceptance_rate is None
    assert a.newly_balanced == [] and not a.endpoints[A].balanced  # not known yet
    s = a.update(20.0, {A: v1(20, 1010, 4040, 3030, 9100, start=None)})  # and back again
    assert not s.restarted and a.restart_times == [] and a.endpoints[A].restarts == 0
    assert a.newly_balanced == [A] and a.endpoints[A].balanced
    assert s.acceptance_rate is None  # no delta across two engines' counters
    for t in (30.0, 40.0, 50.0):  # and so on: never a restart
        s = a.update(t, {A: v1(t, 10 + t, 40 + 4 * t, 20 + t, 90 + t, start=None)})
        s = a.update(t + 5, {A: v1(t + 5, 1010 + t, 4040 + 4 * t, 3030 + t, 9100, start=None)})
        assert not s.restarted
    assert a.restart_times == [] and a.newly_balanced == []


def test_a_restart_without_start_times_is_counted_at_the_next_scrape_dated_at_the_drop() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 1000, 4000, 3000, start=None), B: v1(0, 10, 40, 20, start=None)})
    s = a.update(
        10.0, {A: v1(10, 2, 8, 4, start=None), B: v1(10, 20, 80, 40, start=None)}
    )  # A's counters dropped: a restart or another engine, unknown yet
    assert not s.restarted and a.restart_times == []
    assert s.acceptance_rate == pytest.approx(20 / 40)  # B's delta only
    s = a.update(20.0, {A: v1(20, 12, 48, 34, start=None), B: v1(20, 30, 120, 60, start=None)})
    # A grew from its new counters, never back to the old ones: it restarted after 0.0
    assert s.restarted and a.restart_times == [0.0] and a.endpoints[A].restarts == 1
    assert not a.endpoints[A].balanced and a.newly_balanced == []
    assert s.acceptance_rate == pytest.approx((30 + 20) / (40 + 40))  # the new process's delta
    s = a.update(30.0, {A: v1(30, 22, 88, 44, start=None), B: v1(30, 40, 160, 80, start=None)})
    assert not s.restarted and a.restart_times == [0.0]


def test_a_counter_drop_then_failed_scrapes_is_dated_by_the_failures() -> None:
    a = agg()
    a.update(0.0, {A: v1(0, 1000, 4000, 3000, start=None)})
    a.update(10.0, {A: "refused"})
    a.update(20.0, {A: v1(20, 2, 8, 4, start=None)})
    a.update(30.0, {A: "refused"})
    s = a.update(40.0, {A: v1(40, 12, 48, 14, start=None)})
    assert s.restarted and a.restart_times == [10.0]


def test_balanced_and_direct_endpoints_together_sum_only_the_direct_gauges() -> None:
    a = agg()
    gauges = {"requests_running": 3.0}
    a.update(0.0, {A: v1(0, 1, 4, 2, start=-500.0, **gauges), B: v1(0, 1, 4, 2, start=-50.0)})
    a.update(10.0, {A: v1(10, 1, 4, 2, start=-900.0, **gauges), B: v1(10, 1, 4, 2, start=-50.0)})
    s = a.update(
        20.0,
        {
            A: v1(20, 1, 4, 2, start=-500.0, **gauges),
            B: v1(20, 1, 4, 2, start=-50.0, requests_running=1.0),
        },
    )
    assert a.endpoints[A].balanced and not a.endpoints[B].balanced
    assert s.requests_running == 1.0
