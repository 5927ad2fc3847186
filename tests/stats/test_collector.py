"""The stats gauges: the rollout gate as a state set per model and window, one state at 1."""

from __future__ import annotations

from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest

from specproxy import metrics as names
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.result import StatsResult


def _window(gate: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"samples": {"baseline": 1, "speculative": 1}, "metrics": {}}
    if gate is not None:
        out["gate"] = gate
    return out


def test_the_gate_is_a_state_set_per_model_and_window() -> None:
    result = {
        "computed_at": 1.0,
        "results": {
            "all": {
                "5m": _window({"state": "wait", "reasons": ["E2E inconclusive"]}),
                "all": _window({"state": "fail", "reasons": ["E2E P99 slower"]}),
            },
            "m-a": {"all": _window(None)},  # stored before the gate existed: no series
        },
    }
    registry = CollectorRegistry()
    register_stats_collector(registry, lambda: cast(StatsResult, result))
    text = generate_latest(registry).decode()
    series = {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(names.GATE + "{")
    }
    expected = {
        (window, state): float(state == current)
        for window, current in (("5m", "wait"), ("all", "fail"))
        for state in names.GATE_STATES
    }
    assert series == {
        f'{names.GATE}{{model="all",{names.GATE}="{s}",window="{w}"}}': v
        for (w, s), v in expected.items()
    }


def test_no_result_no_gate_series() -> None:
    registry = CollectorRegistry()
    register_stats_collector(registry, lambda: None)
    lines = generate_latest(registry).decode().splitlines()
    assert f"# TYPE {names.GATE} gauge" in lines
    assert not [line for line in lines if line.startswith(names.GATE + "{")]
