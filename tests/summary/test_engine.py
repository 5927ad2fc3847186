"""Engine-sample aggregates and restart evidence (`summary.engine`) against the per-sample functions
the stats tick used before (`stats.warmup.restart_times`, `stats.diagnosis.summarise_engine`)."""

from __future__ import annotations

import math
import random

import pytest

from specproxy.records import EngineSample
from specproxy.stats.diagnosis import EngineSummary, summarise_aggregate, summarise_engine
from specproxy.stats.warmup import restart_times
from specproxy.summary.engine import (
    MEAN_FIELDS,
    EngineAggregate,
    SampleView,
    StoredView,
    aggregate_samples,
    as_view,
    restart_evidence,
)

_ODD = (None, math.nan, math.inf, -math.inf)


def _value(rng: random.Random, scale: float) -> float | None:
    return rng.choice(_ODD) if rng.random() < 0.15 else rng.random() * scale


def random_engine_samples(seed: int, n: int = 400, replicas: int = 3) -> list[EngineSample]:
    """Samples of both arms in time order as several scraping replicas store them (each its own
    phase, so their samples interleave): failed scrapes in outages, restarts seen after an
    outage or between two good scrapes (some marked on a failed scrape), None and non-finite
    fields, per-position acceptance of varying length (empty too). One sample per (arm, t)."""
    rng = random.Random(seed)
    out: list[EngineSample] = []
    for arm in ("speculative", "baseline"):
        down_until = -1.0
        for i in range(n):
            replica = i % replicas
            t = 1000.0 + i * 5.0 / replicas + replica * 0.01
            if rng.random() < 0.02:
                down_until = t + rng.uniform(5.0, 60.0)
            up = t >= down_until
            restarted = rng.random() < (0.05 if up else 0.02)
            start = rng.choice([None, t - rng.uniform(0.0, 40.0), t + 1.0])
            positions = rng.choice(
                [None, (), tuple(rng.random() for _ in range(rng.randint(1, 6)))]
            )
            out.append(
                EngineSample(
                    t=t,
                    run_id="run",
                    arm=arm,
                    up=up,
                    restarted=restarted,
                    acceptance_rate=_value(rng, 1.0) if up else None,
                    mean_acceptance_length=_value(rng, 4.0) if up else None,
                    position_acceptance=positions if up else None,
                    requests_running=_value(rng, 32.0) if up else None,
                    requests_waiting=_value(rng, 8.0) if up else None,
                    kv_cache_usage=_value(rng, 1.0) if up else None,
                    process_start_time=start,
                )
            )
    return sorted(out, key=lambda s: s.t)


def _reference_summary(samples: list[EngineSample]) -> EngineSummary:
    """`summarise_engine` as it was written before the aggregates (its oracle)."""

    def mean(values: list[float | None]) -> float | None:
        kept = [v for v in values if v is not None and math.isfinite(v)]
        return sum(kept) / len(kept) if kept else None

    up = [s for s in samples if s.up]
    ks = [len(s.position_acceptance) for s in up if s.position_acceptance]
    return EngineSummary(
        samples=len(samples),
        restarts=sum(1 for s in samples if s.restarted),
        up_samples=len(up),
        acceptance_rate=mean([s.acceptance_rate for s in up]),
        mean_acceptance_length=mean([s.mean_acceptance_length for s in up]),
        num_speculative_tokens=max(ks) if ks else None,
        requests_running=mean([s.requests_running for s in up]),
        kv_cache_usage=mean([s.kv_cache_usage for s in up]),
    )


@pytest.mark.parametrize("seed", range(20))
def test_restart_evidence_dates_every_restart_as_all_samples_do(seed: int) -> None:
    samples = random_engine_samples(seed)
    evidence = sorted(
        (s for arm in ("speculative", "baseline") for s in restart_evidence(samples, arm)),
        key=lambda s: s.t,
    )
    assert len(evidence) < len(samples) / 3
    for arm in ("speculative", "baseline"):
        expected = restart_times(samples, arm)
        assert restart_times(evidence, arm) == expected
        assert restart_times(restart_evidence(samples, arm), arm) == expected
    assert sum(len(restart_times(samples, arm)) for arm in ("speculative", "baseline")) > 0


def test_restart_evidence_keeps_the_previous_good_and_first_failed_scrape() -> None:
    def s(t: float, up: bool = True, restarted: bool = False) -> EngineSample:
        return EngineSample(t=t, run_id="r", arm="speculative", up=up, restarted=restarted)

    samples = [s(1), s(2), s(3, up=False), s(4, up=False), s(5, restarted=True), s(6)]
    samples += [s(7, restarted=True), s(8, up=False, restarted=True), s(9)]
    kept = restart_evidence(samples, "speculative")
    assert [x.t for x in kept] == [2, 3, 5, 6, 7]  # 1, 4, 8, 9 date nothing
    assert restart_evidence(samples, "baseline") == []


@pytest.mark.parametrize("seed", range(10))
def test_summaries_of_aggregates_equal_the_per_sample_summary(seed: int) -> None:
    samples = random_engine_samples(seed, replicas=2)
    for arm in ("speculative", "baseline"):
        mine = [s for s in samples if s.arm == arm]
        expected = _reference_summary(mine)
        assert summarise_engine(mine) == expected  # the same sums in the same order: exact
        cut = len(mine) // 3
        merged = aggregate_samples(mine[:cut]).merge(aggregate_samples(mine[cut:]))
        got = summarise_aggregate(merged)
        assert (got.samples, got.restarts, got.up_samples) == (
            expected.samples,
            expected.restarts,
            expected.up_samples,
        )
        assert got.num_speculative_tokens == expected.num_speculative_tokens
        for field in MEAN_FIELDS:
            assert getattr(got, field) == pytest.approx(getattr(expected, field), rel=1e-12)


def test_an_empty_aggregate_summarises_as_no_samples() -> None:
    assert summarise_aggregate(EngineAggregate()) == EngineSummary()
    assert aggregate_samples([]) == EngineAggregate()
    assert EngineAggregate().merge(EngineAggregate(max_k=3)).max_k == 3


def test_views_answer_for_the_windows_they_hold() -> None:
    samples = random_engine_samples(1, n=50)
    view = as_view(samples)
    assert isinstance(view, SampleView) and as_view(view) is view
    since = samples[20].t
    stored = StoredView(
        {since: {arm: view.aggregate(arm, since) for arm in ("speculative", "baseline")}},
        restart_samples=[],
    )
    assert as_view(stored) is stored
    assert stored.aggregate("baseline", since) == view.aggregate("baseline", since)
    assert stored.aggregate("baseline", since).samples < 50
    with pytest.raises(ValueError, match="no engine aggregate"):
        stored.aggregate("baseline", since + 1.0)
