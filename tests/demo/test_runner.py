"""`demo.runner.run_demo` end to end: emulated arms, proxy, store, stats, load, report.

The report's numbers must be the final GET /api/stats result.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from specproxy.demo.capacity import DEMO_EVENT_BUDGET, DEMO_UTILISATION
from specproxy.demo.runner import (
    DemoOptions,
    _config,
    demo_arms,
    emulated_loads,
    emulator_configs,
    run_demo,
)
from specproxy.emulator.config import EmulatorConfig
from specproxy.emulator.model import expected_tokens_per_step, leviathan_speedup
from specproxy.errors import ConfigError
from specproxy.prompts import load_prompts
from specproxy.report.summary import best_line, fmt_ratio, main_window

DRAFT_COST = EmulatorConfig().draft_cost_ratio


@pytest.mark.slow
async def test_short_demo_report_matches_api_stats(tmp_path: Path) -> None:
    opts = DemoOptions(
        rate=12.0,
        duration_s=12.0,
        port=0,
        store=f"sqlite:///{tmp_path / 'demo.db'}",
        out=str(tmp_path / "report"),
        max_tokens=48,
        stats_interval_s=1.0,
        scrape_interval_s=1.0,
        resamples=300,
        time_scale=0.5,
    )
    outcome = await run_demo(opts, console=Console(quiet=True))
    assert not outcome.interrupted
    assert outcome.final_stats is not None and outcome.report_dir is not None
    ok = [r for r in outcome.results if r.ok]
    assert len(ok) > 80 and {r.arm for r in ok} == {"speculative", "baseline"}

    report = json.loads((outcome.report_dir / "report.json").read_text())
    # The report states exactly the final result that GET /api/stats served.
    assert report["stats"] == outcome.final_stats
    final = main_window(outcome.final_stats)
    assert final is not None
    # Every request the client saw is in the store, and the stats job saw all of them.
    assert sum(final["samples"].values()) + sum(final["excluded_warmup"].values()) == len(ok)
    for metric in ("e2e", "tpot"):
        for arm in ("speculative", "baseline"):
            shown = report["figure_data"]["latency"][metric][arm]
            assert shown["n"] == final["metrics"][metric]["n"][arm]
            summary = final["metrics"][metric]["summary"][arm]
            # the figure's median is the rows' own, the result's is read off the grid: they
            # agree within the bound the window states
            bound = final["grid_error_bound"]
            assert shown["median"] == pytest.approx(summary["median"], rel=bound)
    html = (outcome.report_dir / "index.html").read_text()
    speedup = final["metrics"]["tpot"]["speedup"]["median"]
    estimate = speedup["estimate"]
    # The speedup is wall-clock and so depends on the machine's load; what the code guarantees is
    # that it is the ratio of the two arms' medians it reports beside it.
    tpot = final["metrics"]["tpot"]["summary"]
    assert speedup["status"] == "ok" and estimate is not None
    base, spec = tpot["baseline"]["median"], tpot["speculative"]["median"]
    assert base is not None and spec is not None
    assert estimate == pytest.approx(base / spec)
    assert fmt_ratio(speedup["estimate"]) in html
    assert f">{final['metrics']['e2e']['verdict']}<" in html


def test_demo_arms_are_the_shorthand_or_a_control_and_two_ngram_treatments() -> None:
    two = demo_arms(2, acceptance=0.6, speculative_tokens=3)
    assert [(a.name, a.role, a.k, a.acceptance) for a in two] == [
        ("baseline", "control", 0, 0.0),
        ("speculative", "treatment", 3, 0.6),
    ]
    assert sum(a.weight for a in two) == pytest.approx(1.0)
    three = demo_arms(3)
    assert [(a.name, a.role, a.k, a.acceptance) for a in three] == [
        ("baseline", "control", 0, 0.0),
        ("ngram-k2", "treatment", 2, 0.7),
        ("ngram-k4", "treatment", 4, 0.5),
    ]
    assert three[1].labels == {"method": "ngram", "k": "2"}
    # the configured truth: k=2 at 0.7 is clearly faster than k=4 at 0.5 (emulator model)
    k2, k4 = (leviathan_speedup(a.acceptance, a.k, DRAFT_COST) for a in three[1:])
    assert k2 == pytest.approx(1.825, abs=1e-3) and k4 == pytest.approx(1.384, abs=1e-3)
    assert k2 > 1.25 * k4
    with pytest.raises(ConfigError, match="2 or 3 arms"):
        demo_arms(4)


def test_three_arm_config_names_the_arms_and_splits_by_weight() -> None:
    opts = DemoOptions(arms=3)
    configs = emulator_configs(opts)
    assert list(configs) == ["baseline", "ngram-k2", "ngram-k4"]
    assert not configs["baseline"].speculative
    assert (configs["ngram-k4"].num_speculative_tokens, configs["ngram-k4"].acceptance) == (4, 0.5)
    urls = {name: f"http://127.0.0.1:{9000 + i}" for i, name in enumerate(configs)}
    cfg = _config(opts, "r", urls)
    assert not cfg.shorthand and cfg.control_arm == "baseline"
    assert cfg.treatment_arms == ("ngram-k2", "ngram-k4")
    assert cfg.arm_shares() == pytest.approx({a: 1 / 3 for a in configs})
    assert cfg.arm_config("ngram-k2").labels == {"method": "ngram", "k": "2"}
    # the modelled load splits the rate as the proxy routes it, and stays within the demo's
    # bounds with three arms too
    loads = emulated_loads(opts, load_prompts(None))
    assert {a: load.rate for a, load in loads.items()} == pytest.approx(
        {a: opts.rate * share for a, share in cfg.arm_shares().items()}
    )
    assert max(load.utilisation for load in loads.values()) <= DEMO_UTILISATION
    assert sum(load.events_per_s for load in loads.values()) <= DEMO_EVENT_BUDGET
    # the two-arm demo keeps its shorthand config
    two = _config(
        DemoOptions(), "r", {"speculative": urls["ngram-k2"], "baseline": urls["baseline"]}
    )
    assert two.shorthand and two.arm_names == ("baseline", "speculative")


def test_the_two_arm_demo_keeps_its_emulators() -> None:
    """`make demo` (`--arms 2`) runs the emulators it always did, seeds included."""
    opts = DemoOptions()
    common: dict[str, Any] = {
        "num_speculative_tokens": 4,
        "acceptance": 0.8,
        "per_request_metrics": True,
        "time_scale": 1.0,
        "slowdown": 1.0,
    }
    assert emulator_configs(opts) == {
        "baseline": EmulatorConfig(speculative=False, seed=2, **common),
        "speculative": EmulatorConfig(
            speculative=True, per_request_spec_metrics="summary", seed=1, **common
        ),
    }


@pytest.mark.slow
async def test_three_arm_demo_compares_each_treatment_and_answers_best(tmp_path: Path) -> None:
    opts = DemoOptions(
        arms=3,
        rate=12.0,
        duration_s=12.0,
        port=0,
        store="memory://",
        out=str(tmp_path / "report"),
        max_tokens=48,
        stats_interval_s=1.0,
        scrape_interval_s=1.0,
        resamples=300,
        time_scale=0.5,
    )
    outcome = await run_demo(opts, console=Console(quiet=True))
    assert outcome.final_stats is not None and outcome.report_dir is not None
    ok = [r for r in outcome.results if r.ok]
    assert len(ok) > 80 and {r.arm for r in ok} == {"baseline", "ngram-k2", "ngram-k4"}
    window = main_window(outcome.final_stats)
    assert window is not None
    assert window.get("control") == "baseline"
    assert window.get("treatments") == ["ngram-k2", "ngram-k4"]
    comparisons = window.get("comparisons") or {}
    assert set(comparisons) == {"ngram-k2", "ngram-k4"}
    for name, comparison in comparisons.items():
        assert comparison["treatment"] == name
        assert set(comparison["samples"]) == {"baseline", name}
        assert set(comparison["metrics"]) == {"e2e", "ttft", "tpot"}
    best = window.get("best")
    assert best is not None and best["state"] in ("winner", "no_winner_yet")
    assert set(best["speedups"]) == {"ngram-k2", "ngram-k4"}
    final = main_window(outcome.final_stats)
    assert final is not None and best_line(final) is not None
    # The emulators' configured truth orders the treatments: by the tokens each step emitted
    # (the emulators' own per-request spec-decode counts and their /metrics), never by
    # wall-clock speed, which a loaded machine bends.
    arms = {a.name: a for a in demo_arms(3)}
    implied: dict[str, float] = {}
    for name in ("ngram-k2", "ngram-k4"):
        lengths = [
            r.measures.mean_acceptance_length
            for r in ok
            if r.arm == name and r.measures.mean_acceptance_length is not None
        ]
        assert len(lengths) > 20
        per_step = statistics.fmean(lengths)
        truth = expected_tokens_per_step(arms[name].acceptance, arms[name].k)
        assert per_step == pytest.approx(truth, rel=0.1)
        engine = comparisons[name]["engine"][name]
        assert engine["num_speculative_tokens"] == arms[name].k
        assert engine["mean_acceptance_length"] == pytest.approx(truth, rel=0.1)
        implied[name] = per_step / (1 + arms[name].k * DRAFT_COST)
    assert implied["ngram-k2"] > 1.15 * implied["ngram-k4"] > 1.15
