"""The engine collector: version-independent series by arm, absent when unknown."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from specproxy import metrics
from specproxy.records import Arm, EngineSample
from specproxy.scrape.aggregate import EndpointState
from specproxy.scrape.collector import register_engine_collector
from specproxy.scrape.loop import ArmState
from specproxy.scrape.parse import EngineSnapshot, SpecFormat

E1, E2 = "http://10.0.0.1:8000", "http://10.0.0.2:8000"


def endpoints(*states: tuple[str, bool]) -> dict[str, EndpointState]:
    return {url: EndpointState(url, up=up) for url, up in states}


def states() -> dict[Arm, ArmState]:
    spec = ArmState(
        "speculative",
        up=True,
        sample=EngineSample(
            t=1.0,
            run_id="r",
            arm="speculative",
            up=True,
            requests_running=3.0,
            requests_waiting=1.0,
            kv_cache_usage=0.25,
            generation_tokens_per_s=42.0,
        ),
        acceptance_rate=0.7,
        mean_acceptance_length=3.1,
        position_acceptance=(0.9, 0.6),
        restart_times=[5.0, 9.0],
        endpoints=endpoints((E1, True), (E2, False)),
    )
    snapshot = EngineSnapshot(t=1.0, spec_format=SpecFormat.V1, engines=1, generation_tokens=1234)
    spec.endpoints[E1].snapshot = snapshot
    spec.endpoints[E2].snapshot = snapshot  # down: its last counter is not exported
    baseline = ArmState(
        "baseline",
        up=True,
        sample=EngineSample(t=1.0, run_id="r", arm="baseline", up=True, requests_running=2.0),
        endpoints=endpoints((E1, True)),
    )
    return {"speculative": spec, "baseline": baseline}


def value(registry: CollectorRegistry, name: str, arm: Arm, **labels: str) -> float | None:
    return registry.get_sample_value(name, {"arm": arm, **labels})


def test_exports_speculative_arm() -> None:
    registry = CollectorRegistry()
    register_engine_collector(registry, states())
    s = "speculative"
    assert value(registry, metrics.ENGINE_UP, s, endpoint=E1) == 1.0
    assert value(registry, metrics.ENGINE_UP, s, endpoint=E2) == 0.0  # the arm is still up
    assert value(registry, metrics.ENGINE_ACCEPTANCE_RATIO, s) == 0.7
    assert value(registry, metrics.ENGINE_MEAN_ACCEPTANCE_LENGTH, s) == 3.1
    pos = metrics.ENGINE_POSITION_ACCEPTANCE_RATIO
    assert value(registry, pos, s, position="0") == 0.9
    assert value(registry, pos, s, position="1") == 0.6
    assert value(registry, metrics.ENGINE_REQUESTS_RUNNING, s) == 3.0
    assert value(registry, metrics.ENGINE_REQUESTS_WAITING, s) == 1.0
    assert value(registry, metrics.ENGINE_KV_CACHE_USAGE, s) == 0.25
    # the engine's own counter, passed through for rate(); no precomputed tokens/s gauge
    tokens = metrics.ENGINE_GENERATION_TOKENS + "_total"
    assert value(registry, tokens, s, endpoint=E1) == 1234.0
    assert value(registry, tokens, s, endpoint=E2) is None
    assert "tokens_per_second" not in generate_latest(registry).decode()
    assert value(registry, metrics.ENGINE_RESTARTS + "_total", s) == 2.0


def test_baseline_spec_series_are_absent_not_zero() -> None:
    registry = CollectorRegistry()
    register_engine_collector(registry, states())
    b = "baseline"
    assert value(registry, metrics.ENGINE_UP, b, endpoint=E1) == 1.0
    assert value(registry, metrics.ENGINE_UP, b, endpoint=E2) is None  # not in its pool
    assert value(registry, metrics.ENGINE_ACCEPTANCE_RATIO, b) is None
    assert value(registry, metrics.ENGINE_MEAN_ACCEPTANCE_LENGTH, b) is None
    text = generate_latest(registry).decode()
    assert 'position_acceptance_ratio{arm="baseline"' not in text
    # no snapshot yet: the counter is absent, not a false 0
    assert value(registry, metrics.ENGINE_GENERATION_TOKENS + "_total", b, endpoint=E1) is None
    assert value(registry, metrics.ENGINE_REQUESTS_RUNNING, b) == 2.0
    assert value(registry, metrics.ENGINE_KV_CACHE_USAGE, b) is None  # not reported
    assert value(registry, metrics.ENGINE_RESTARTS + "_total", b) == 0.0


def test_down_arm_keeps_only_up_and_restarts() -> None:
    st = states()
    st["speculative"].up = False
    st["speculative"].endpoints = endpoints((E1, False), (E2, False))
    registry = CollectorRegistry()
    register_engine_collector(registry, st)
    s = "speculative"
    assert value(registry, metrics.ENGINE_UP, s, endpoint=E1) == 0.0
    assert value(registry, metrics.ENGINE_RESTARTS + "_total", s) == 2.0
    for name in (
        metrics.ENGINE_ACCEPTANCE_RATIO,
        metrics.ENGINE_REQUESTS_RUNNING,
        metrics.ENGINE_KV_CACHE_USAGE,
    ):
        assert value(registry, name, s) is None, name
    tokens = metrics.ENGINE_GENERATION_TOKENS + "_total"
    assert value(registry, tokens, s, endpoint=E1) is None


def test_before_first_scrape_up_is_absent() -> None:
    registry = CollectorRegistry()
    register_engine_collector(registry, {arm: ArmState(arm) for arm in ("speculative", "baseline")})
    text = generate_latest(registry).decode()
    assert metrics.ENGINE_UP + "{" not in text
    assert value(registry, metrics.ENGINE_RESTARTS + "_total", "speculative") == 0.0


def test_collector_reads_live_state() -> None:
    st = states()
    registry = CollectorRegistry()
    register_engine_collector(registry, st)
    st["speculative"].acceptance_rate = 0.5
    assert value(registry, metrics.ENGINE_ACCEPTANCE_RATIO, "speculative") == 0.5


def test_names_are_described_so_duplicates_are_refused() -> None:
    registry = CollectorRegistry()
    register_engine_collector(registry, states())
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        register_engine_collector(registry, states())
