"""The stats gauges: the rollout gate as a state set per model and window, one state at 1; the
low-acceptance rule's inputs for its alert."""

from __future__ import annotations

import functools
from typing import Any, cast

from prometheus_client import CollectorRegistry, generate_latest

from specproxy import metrics as names
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.diagnosis import DiagnosisInput, EngineSummary, diagnose, tokens_per_step
from specproxy.stats.result import StatsResult


def _window(gate: dict[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "samples": {"baseline": 1, "speculative": 1},
        "metrics": {},
        "diagnosis": {},
    }
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
        f'{names.GATE}{{arm="speculative",model="all",{names.GATE}="{s}",window="{w}"}}': v
        for (w, s), v in expected.items()
    }


def test_no_result_no_gate_series() -> None:
    registry = CollectorRegistry()
    register_stats_collector(registry, lambda: None)
    lines = generate_latest(registry).decode().splitlines()
    assert f"# TYPE {names.GATE} gauge" in lines
    assert not [line for line in lines if line.startswith(names.GATE + "{")]


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
    key = 'arm="speculative",model="m",window="5m"'  # the treatment compared
    assert f"specproxy_speculation_tokens_per_step{{{key}}} 1.1111" in text
    assert f"specproxy_speculation_break_even_tokens_per_step{{{key}}} 1.4" in text


def test_no_series_without_k() -> None:
    text = _scrape(_result(None))
    assert "specproxy_speculation_tokens_per_step{" not in text
    assert "specproxy_speculation_break_even_tokens_per_step{" not in text


def test_speedups_by_condition_and_the_crossover_are_gauges_with_bounded_labels() -> None:
    window = _window(None)
    window["conditions"] = {
        "segments": {
            "load": {
                "tpot": [
                    {"band": "1", "speedup": 1.9, "lower": 1.8, "upper": 2.0},
                    {"band": "32+", "speedup": None, "lower": None, "upper": None},
                ]
            }
        },
        "crossover": {"tpot": {"load": 26.3, "lower": 26.1, "upper": None}},
    }
    text = _scrape(cast(StatsResult, {"computed_at": 1.0, "results": {"all": {"all": window}}}))
    seg = names.SEGMENT_SPEEDUP
    labels = (
        'arm="speculative",band="1",bound="{}",dimension="load",metric="tpot",'
        'model="all",window="all"'
    )
    for bound, value in (("estimate", 1.9), ("lower", 1.8), ("upper", 2.0)):
        assert f"{seg}{{{labels.format(bound)}}} {value}" in text
    assert 'band="32+"' not in text  # too little data: no series, never a number
    cross = names.CROSSOVER_LOAD
    assert (
        f'{cross}{{arm="speculative",bound="estimate",metric="tpot",model="all",window="all"}} 26.3'
        in text
    )
    assert (
        f'{cross}{{arm="speculative",bound="lower",metric="tpot",model="all",window="all"}} 26.1'
        in text
    )
    assert f'{cross}{{arm="speculative",bound="upper"' not in text  # beyond the observed range


def test_the_future_rows_gauge_reads_the_result_and_zero_for_an_older_one() -> None:
    """specproxy_stats_future_rows: the requests the result left out for stamps after now; a
    result stored before the field existed left none out."""
    for held, want in (({"future_rows": 12}, "12.0"), ({}, "0.0")):
        result = cast(StatsResult, {"computed_at": 1.0, "results": {}, **held})
        registry = CollectorRegistry()
        register_stats_collector(registry, functools.partial(lambda r: r, result))
        text = generate_latest(registry).decode()
        assert f"{names.STATS_FUTURE_ROWS} {want}" in text


async def test_each_treatment_of_a_three_arm_result_has_its_own_series() -> None:
    """A/B/n: the comparison gauges carry `arm`, the treatment compared with the control, one
    set per treatment of the result (bounded by its arms); the verdict and gate stay state sets
    with one state at 1 per treatment; the per-arm sample counts name the control too."""
    from prometheus_client.parser import text_string_to_metric_families

    from specproxy.stats.result import comparisons_of
    from tests.report import abn

    result = await abn.three_arm_result()
    registry = CollectorRegistry()
    register_stats_collector(registry, lambda: result)
    text = generate_latest(registry).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]

    def series(name: str) -> list[Any]:
        return [
            s
            for s in samples
            if s.name == name and (s.labels["model"], s.labels["window"]) == ("all", "all")
        ]

    window = result["results"]["all"]["all"]
    comparisons = window.get("comparisons") or {}
    assert set(comparisons) == set(comparisons_of(window)) == set(abn.TREATMENTS)
    for family in (names.SPEEDUP, names.VERDICT, names.GATE, names.P99_SLOWDOWN):
        assert {s.labels["arm"] for s in series(family)} == set(abn.TREATMENTS), family
    for treatment, comparison in comparisons.items():
        mine = [s for s in series(names.VERDICT) if s.labels["arm"] == treatment]
        for metric, block in comparison["metrics"].items():
            on = [s.labels[names.VERDICT] for s in mine if s.labels["metric"] == metric and s.value]
            assert on == [block["verdict"]], (treatment, metric)
            median = block["speedup"]["median"]
            (estimate,) = [
                s.value
                for s in series(names.SPEEDUP)
                if s.labels["arm"] == treatment
                and s.labels["metric"] == metric
                and s.labels["statistic"] == "median"
                and s.labels["bound"] == "estimate"
            ]
            assert estimate == median["estimate"]
        (gate,) = [
            s.labels[names.GATE]
            for s in series(names.GATE)
            if s.labels["arm"] == treatment and s.value
        ]
        assert gate == comparison["gate"]["state"]
    # the two treatments' series differ: they are not one comparison published twice
    e2e = {
        s.labels["arm"]: s.value
        for s in series(names.SPEEDUP)
        if (s.labels["metric"], s.labels["statistic"], s.labels["bound"])
        == ("e2e", "median", "estimate")
    }
    assert e2e["eagle"] != e2e["ngram-k4"]
    counts = {s.labels["arm"]: s.value for s in series(names.SAMPLES)}
    assert set(counts) == set(abn.ARMS)
