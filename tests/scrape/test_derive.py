"""From two snapshots to an EngineSample: deltas, V0 gauges, restarts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from specproxy.records import EngineSample
from specproxy.scrape.derive import (
    START_SLACK_S,
    Change,
    classify_change,
    derive_sample,
    is_restart,
    restart_time,
)
from specproxy.scrape.parse import EngineSnapshot, SpecFormat, parse_metrics
from tests.conftest import fixture_path
from tests.scrape.fakes import EngineCounts, v1_text

V0_FIXTURES = Path(__file__).parent.parent / "fixtures" / "vllm-v0"


def v1(t: float, **values: Any) -> EngineSnapshot:
    """A single-engine V1 snapshot; the process start time stays 100 unless given."""
    values.setdefault("process_start_time", 100.0)
    return EngineSnapshot(t=t, spec_format=SpecFormat.V1, engines=1, **values)


def derive(prev: EngineSnapshot | None, cur: EngineSnapshot) -> EngineSample:
    return derive_sample(prev, cur, run_id="r", arm="speculative")


def test_first_scrape_has_gauges_but_no_rates() -> None:
    snap = parse_metrics(fixture_path("metrics_spec.prom").read_text(), t=1000.0)
    sample = derive_sample(None, snap, run_id="r", arm="speculative")
    assert sample.up and not sample.restarted
    assert sample.acceptance_rate is None
    assert sample.mean_acceptance_length is None
    assert sample.position_acceptance is None
    assert sample.generation_tokens_per_s is None
    assert sample.kv_cache_usage == 0.0
    assert sample.process_start_time == pytest.approx(1795940000.07)


def test_v1_rates_from_deltas_of_real_fixture_counters() -> None:
    # The real fixture as the first scrape; 10 s later every counter has moved on.
    first = parse_metrics(fixture_path("metrics_spec.prom").read_text(), t=1000.0)
    assert first.process_start_time is not None
    later = v1_text(
        [EngineCounts(36 + 20, 124 + 80, 124 + 50, (36 + 18, 36 + 14, 26 + 11, 26 + 7), 232 + 90)],
        start_time=first.process_start_time,
    )
    sample = derive_sample(first, parse_metrics(later, t=1010.0), run_id="r", arm="speculative")
    assert not sample.restarted
    assert sample.acceptance_rate == pytest.approx(50 / 80)
    assert sample.mean_acceptance_length == pytest.approx(1 + 50 / 20)
    assert sample.position_acceptance == pytest.approx((18 / 20, 14 / 20, 11 / 20, 7 / 20))
    assert sample.generation_tokens_per_s == pytest.approx(90 / 10)
    assert sample.run_id == "r" and sample.arm == "speculative" and sample.t == 1010.0


def test_multi_engine_deltas_are_summed_before_dividing() -> None:
    before = [EngineCounts(10, 40, 30, (10, 9, 7, 4), 100), EngineCounts(0, 0, 0, (0, 0, 0, 0), 0)]
    after = [
        EngineCounts(20, 80, 40, (15, 12, 8, 5), 150),  # +10 drafts, +40 tokens, +10 accepted
        EngineCounts(30, 120, 90, (28, 25, 22, 15), 250),  # +30 drafts, +120 tokens, +90 accepted
    ]
    sample = derive(parse_metrics(v1_text(before), t=0), parse_metrics(v1_text(after), t=5))
    assert sample.acceptance_rate == pytest.approx((10 + 90) / (40 + 120))
    assert sample.mean_acceptance_length == pytest.approx(1 + 100 / 40)
    assert sample.position_acceptance == pytest.approx(
        ((5 + 28) / 40, (3 + 25) / 40, (1 + 22) / 40, (1 + 15) / 40)
    )
    assert sample.generation_tokens_per_s == pytest.approx((50 + 250) / 5)


def test_idle_interval_has_no_acceptance_but_a_zero_token_rate() -> None:
    counters = {"num_drafts": 5.0, "num_draft_tokens": 20.0, "num_accepted_tokens": 9.0}
    sample = derive_sample(
        v1(0, generation_tokens=50.0, **counters),
        v1(5, generation_tokens=50.0, **counters),
        run_id="r",
        arm="speculative",
    )
    assert sample.acceptance_rate is None
    assert sample.mean_acceptance_length is None
    assert sample.generation_tokens_per_s == 0.0


def test_early_v1_without_drafts_counter_gives_acceptance_only() -> None:
    sample = derive_sample(
        v1(0, num_draft_tokens=10.0, num_accepted_tokens=5.0),
        v1(5, num_draft_tokens=30.0, num_accepted_tokens=12.0),
        run_id="r",
        arm="speculative",
    )
    assert sample.acceptance_rate == pytest.approx(7 / 20)
    assert sample.mean_acceptance_length is None


def test_new_positions_count_from_zero() -> None:
    sample = derive_sample(
        v1(0, num_drafts=10.0, accepted_per_position=(5.0,)),
        v1(5, num_drafts=20.0, accepted_per_position=(9.0, 4.0)),
        run_id="r",
        arm="speculative",
    )
    assert sample.position_acceptance == pytest.approx((0.4, 0.4))


def test_baseline_has_no_spec_fields() -> None:
    first = parse_metrics(fixture_path("metrics_baseline.prom").read_text(), t=0.0)
    later = v1_text(
        [EngineCounts(generation_tokens=120 + 40)], spec=False, start_time=1.79594000007e9
    )
    sample = derive_sample(first, parse_metrics(later, t=4.0), run_id="r", arm="baseline")
    assert sample.acceptance_rate is None
    assert sample.mean_acceptance_length is None
    assert sample.position_acceptance is None
    assert sample.generation_tokens_per_s == pytest.approx(10.0)


def test_v0_uses_gauges_and_infers_acceptance_length() -> None:
    first = parse_metrics((V0_FIXTURES / "metrics_spec.prom").read_text(), t=0.0)
    later = parse_metrics((V0_FIXTURES / "metrics_spec_later.prom").read_text(), t=10.0)
    s0 = derive_sample(None, first, run_id="r", arm="speculative")
    s1 = derive_sample(first, later, run_id="r", arm="speculative")
    # Gauges are cumulative, so even the first scrape has an acceptance rate.
    assert s0.acceptance_rate == 0.62
    assert s1.acceptance_rate == pytest.approx(870 / 1400)
    # k = 4 is recovered, so L = efficiency * (k + 1) exactly.
    assert s0.mean_acceptance_length == pytest.approx(0.56 * 5)
    assert s1.mean_acceptance_length == pytest.approx(0.56 * 5)
    assert s1.position_acceptance is None  # V0 has no per-position metrics
    assert not s1.restarted
    assert s1.kv_cache_usage == 0.1875
    assert s1.generation_tokens_per_s == pytest.approx((1230 - 850) / 10)


def test_v0_acceptance_length_needs_consistent_counters() -> None:
    snap = EngineSnapshot(
        t=0,
        spec_format=SpecFormat.V0,
        engines=1,
        v0_acceptance_rate=0.5,
        v0_efficiency=0.6,
        num_draft_tokens=100.0,
        num_emitted_tokens=50.0,  # emitted/draft below efficiency: impossible, so no estimate
    )
    sample = derive_sample(None, snap, run_id="r", arm="speculative")
    assert sample.acceptance_rate == 0.5
    assert sample.mean_acceptance_length is None


def test_restart_by_process_start_time() -> None:
    prev = v1(10, num_drafts=50.0, num_draft_tokens=200.0, num_accepted_tokens=150.0)
    cur = v1(
        20,
        process_start_time=15.0,
        num_drafts=60.0,
        num_draft_tokens=240.0,
        num_accepted_tokens=170.0,
    )  # counters even grew: only the start time shows the restart
    assert is_restart(prev, cur)
    assert restart_time(prev, cur) == 15.0
    sample = derive_sample(prev, cur, run_id="r", arm="speculative")
    assert sample.restarted
    assert sample.acceptance_rate is None  # the delta spans two processes
    assert sample.generation_tokens_per_s is None
    assert sample.process_start_time == 15.0


@pytest.mark.parametrize(
    "field",
    ["num_drafts", "num_draft_tokens", "num_accepted_tokens", "generation_tokens"],
)
def test_restart_by_counter_decrease(field: str) -> None:
    values = {
        "num_drafts": 5.0,
        "num_draft_tokens": 20.0,
        "num_accepted_tokens": 10.0,
        "generation_tokens": 40.0,
    }
    prev = v1(10, **values)
    cur = v1(20, **{**values, field: values[field] - 1})
    assert is_restart(prev, cur)
    assert restart_time(prev, cur) == 10.0  # unknown start: the earliest possible moment
    assert derive_sample(prev, cur, run_id="r", arm="speculative").restarted


def test_restart_by_per_position_decrease() -> None:
    prev = v1(10, accepted_per_position=(5.0, 3.0))
    cur = v1(20, accepted_per_position=(6.0, 2.0))
    assert is_restart(prev, cur)


def test_start_time_outside_the_interval_is_not_trusted() -> None:
    prev = v1(10, process_start_time=5.0)
    cur = v1(20, process_start_time=500.0)  # clock skew between hosts
    assert restart_time(prev, cur) == 10.0


def test_steady_engine_is_not_a_restart() -> None:
    prev = v1(10, num_drafts=5.0, accepted_per_position=(5.0,))
    cur = v1(20, num_drafts=5.0, accepted_per_position=(5.0, 1.0))
    assert not is_restart(prev, cur)


def test_restart_after_failed_scrapes_is_not_dated_before_the_first_failure() -> None:
    prev = v1(10, process_start_time=1.0)
    cur = v1(30, process_start_time=19.4)  # reads ~1 s early against the wall clock
    assert restart_time(prev, cur) == 19.4
    assert restart_time(prev, cur, first_failed=20.0) == 20.0
    assert restart_time(prev, v1(30, process_start_time=25.0), first_failed=20.0) == 25.0


def test_a_change_of_process_is_a_restart_only_when_it_can_be_one() -> None:
    prev = v1(100.0, process_start_time=50.0, num_drafts=10.0)
    # a newer process that started after the previous scrape: a restart
    assert classify_change(prev, v1(110.0, process_start_time=105.0), ()) is Change.RESTART
    # within the slack before it (vLLM's start time reads ~1 s early): still one
    early = 100.0 - START_SLACK_S + 1
    assert classify_change(prev, v1(110.0, process_start_time=early), ()) is Change.RESTART
    # an older process, one running long before the previous scrape, or one seen before behind
    # this URL: another engine answering, never a restart
    assert classify_change(prev, v1(110.0, process_start_time=40.0), ()) is Change.OTHER_ENGINE
    assert classify_change(prev, v1(110.0, process_start_time=60.0), ()) is Change.OTHER_ENGINE
    assert classify_change(prev, v1(110.0, process_start_time=105.0), {105.0}) is (
        Change.OTHER_ENGINE
    )
    # the same start time, or none to compare: counters that went up are the same process; one
    # that went down is a restart or another engine, which the next scrape tells
    same = v1(110.0, process_start_time=50.0, num_drafts=12.0)
    assert classify_change(prev, same, ()) is Change.NONE
    reset = v1(110.0, process_start_time=50.0, num_drafts=1.0)
    assert classify_change(prev, reset, ()) is Change.COUNTERS_DOWN
    startless = v1(100.0, process_start_time=None, num_drafts=10.0)
    assert classify_change(startless, v1(110.0, process_start_time=None, num_drafts=11.0), ()) is (
        Change.NONE
    )
    assert classify_change(startless, v1(110.0, process_start_time=None, num_drafts=1.0), ()) is (
        Change.COUNTERS_DOWN
    )
