from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest

from specproxy.stats.collector import register_stats_collector
from specproxy.stats.diagnosis import DiagnosisInput, EngineSummary, diagnose, tokens_per_step
from specproxy.stats.result import StatsResult


def _result(acceptance: float | None) -> StatsResult:
    """A stats result whose one window's diagnosis saw k = 4 at this per-token acceptance."""
    spec = EngineSummary(samples=5, up_samples=5)
    if acceptance is not None:
        length = tokens_per_step(acceptance, 4)
        spec = EngineSummary(
            samples=5, up_samples=5, mean_acceptance_length=length, num_speculative_tokens=4
        )
    diagnosis = diagnose(DiagnosisInput(1.2, 1.1, 1.3, True, 0, spec, EngineSummary()))
    window: dict[str, Any] = {"samples": {}, "metrics": {}, "diagnosis": diagnosis.to_dict()}
    return cast(StatsResult, {"computed_at": 1.0, "results": {"m": {"5m": window}}})


def _scrape(result: StatsResult) -> str:
    registry = CollectorRegistry()
    register_stats_collector(registry, lambda: result)
    return generate_latest(registry).decode()


def test_the_low_acceptance_rules_inputs_are_exported_for_the_alert() -> None:
    text = _scrape(_result(0.1))
    assert 'specproxy_speculation_tokens_per_step{model="m",window="5m"} 1.1111' in text
    assert 'specproxy_speculation_break_even_tokens_per_step{model="m",window="5m"} 1.4' in text


def test_no_series_without_k() -> None:
    text = _scrape(_result(None))
    assert "specproxy_speculation_tokens_per_step{" not in text
    assert "specproxy_speculation_break_even_tokens_per_step{" not in text
