"""Calibration advice (`bench.calibration`) on synthetic sweeps: blocks as `bench --json` writes
them, CIs given, so every decision rule is checked on known numbers."""

from __future__ import annotations

from typing import Any

import numpy as np

from specproxy.bench.calibration import Candidate, advise, advise_sweep, load_label


def block(
    k: int | None,
    temperature: float,
    ci: tuple[float, float, float] | None,
    *,
    run_id: str | None = None,
    concurrency: int | None = 8,
    rate: float | None = None,
    needed: int = 0,
) -> dict[str, Any]:
    """One bench block; `ci` = (estimate, lower, upper), None: too few samples (`needed` more)."""
    median: dict[str, Any]
    if ci is None:
        median = {"status": "insufficient", "n_needed": {"speculative": needed, "baseline": 0}}
    else:
        median = {"status": "ok", "estimate": ci[0], "lower": ci[1], "upper": ci[2]}
    return {
        "run_id": run_id or f"k{k}-t{temperature:g}",
        "temperature": temperature,
        "k": k,
        "concurrency": concurrency,
        "rate": rate,
        "speedups": {"e2e": {"median": median}},
    }


def test_best_setting_is_named_and_clearly_ahead() -> None:
    sweep = [
        block(2, 0.0, (1.30, 1.20, 1.40)),
        block(4, 0.0, (1.80, 1.65, 1.95)),
        block(4, 1.0, (1.10, 1.00, 1.20)),
        block(2, 1.0, (0.95, 0.90, 1.01)),
    ]
    (advice,) = advise_sweep(sweep)
    assert advice.decision == "enable"
    assert advice.best is not None and (advice.best.k, advice.best.temperature) == (4, 0.0)
    assert advice.runner_up is not None and advice.runner_up.k == 2
    assert advice.distinguishable is True and advice.ties == []
    assert [c.run_id for c in advice.ranked] == ["k4-t0", "k2-t0", "k4-t1", "k2-t1"]
    assert advice.message.startswith("enable speculation with k=4, T=0: 1.80x [1.65, 1.95]")
    assert "clearly ahead of the runner-up k=2, T=0" in advice.message
    assert advice.message.endswith("confirm a close call by repeating the runs in another order")
    assert advice.load == "8 clients"


def test_overlapping_cis_name_every_tie() -> None:
    sweep = [
        block(2, 0.0, (1.50, 1.30, 1.70)),
        block(4, 0.0, (1.55, 1.35, 1.75)),
        block(8, 0.0, (1.40, 1.25, 1.45)),  # its CI reaches the best's lower bound
        block(8, 0.5, (1.10, 1.05, 1.20)),  # below the best's CI: not a tie
    ]
    (advice,) = advise_sweep(sweep)
    assert advice.decision == "enable"
    assert advice.best is not None and advice.best.k == 4
    assert advice.distinguishable is False
    assert [c.k for c in advice.ties] == [2, 8]
    assert [c.temperature for c in advice.ties] == [0.0, 0.0]
    assert "not distinguishable from k=2, T=0: 1.50x [1.30, 1.70], k=8, T=0: 1.40x" in (
        advice.message
    )


def test_no_faster_setting_means_do_not_enable() -> None:
    sweep = [block(2, 0.0, (0.80, 0.74, 0.86)), block(4, 0.0, (0.70, 0.65, 0.75))]
    (advice,) = advise_sweep(sweep)
    assert advice.decision == "do_not_enable"
    assert advice.message.startswith("do not enable speculation: no setting faster")
    assert advice.best is not None and advice.best.k == 2  # still the least bad, named
    assert advice.distinguishable is False  # 0.75 upper reaches 0.74: the CIs overlap


def test_one_setting_slower() -> None:
    (advice,) = advise_sweep([block(4, 0.0, (0.74, 0.70, 0.79))])
    assert advice.decision == "do_not_enable"
    assert "this setting is not faster" in advice.message
    assert advice.runner_up is None and advice.distinguishable is None


def test_best_ci_including_one_is_inconclusive() -> None:
    # the best point estimate is above 1 but its CI includes 1; another setting's CI is below 1
    sweep = [block(2, 0.0, (1.05, 0.95, 1.15)), block(4, 0.0, (0.80, 0.75, 0.85))]
    (advice,) = advise_sweep(sweep)
    assert advice.decision == "inconclusive"
    assert advice.message.startswith("inconclusive: no setting is shown faster")
    assert "its CI includes 1" in advice.message
    assert advice.distinguishable is True


def test_best_below_one_beside_a_wide_ci_is_inconclusive() -> None:
    # every estimate is below 1, but one setting's CI reaches above 1: not shown slower either
    sweep = [block(2, 0.0, (0.90, 0.85, 0.95)), block(4, 0.0, (0.85, 0.60, 1.10))]
    (advice,) = advise_sweep(sweep)
    assert advice.decision == "inconclusive"
    assert advice.best is not None and advice.best.k == 2
    assert "its CI lies below 1, but not every one does" in advice.message


def test_insufficient_blocks_are_listed_not_ranked() -> None:
    sweep = [block(2, 0.0, None, needed=40), block(4, 0.0, (1.2, 1.1, 1.3))]
    (advice,) = advise_sweep(sweep)
    assert [c.k for c in advice.ranked] == [4]
    assert [(i.k, i.n_needed["speculative"]) for i in advice.insufficient] == [(2, 40)]
    (nothing,) = advise_sweep([block(2, 0.0, None, needed=40)])
    assert nothing.decision == "no_data" and nothing.best is None
    assert "up to 40 more requests per arm" in nothing.message


def test_single_arm_blocks_give_no_data() -> None:
    one_arm = {"run_id": "r", "temperature": 0.0, "k": None, "speedups": {}}
    (advice,) = advise_sweep([one_arm])
    assert advice.decision == "no_data" and advice.ranked == []


def test_each_load_level_gets_its_own_advice() -> None:
    sweep = [
        block(4, 0.0, (1.6, 1.5, 1.7), rate=1.0, concurrency=None, run_id="a-r1"),
        block(4, 0.0, (0.8, 0.7, 0.9), rate=8.0, concurrency=None, run_id="a-r8"),
        block(2, 0.0, (1.3, 1.2, 1.4), rate=1.0, concurrency=None, run_id="b-r1"),
        block(2, 0.0, (0.9, 0.85, 0.95), rate=8.0, concurrency=None, run_id="b-r8"),
    ]
    low, high = advise_sweep(sweep)
    assert (low.load, low.decision) == ("1 req/s", "enable")
    assert low.best is not None and low.best.run_id == "a-r1"
    assert (high.load, high.decision) == ("8 req/s", "do_not_enable")
    assert high.best is not None and high.best.run_id == "b-r8"


def test_ties_on_the_estimate_prefer_the_tighter_then_the_smaller_k() -> None:
    a = Candidate("a", 0.0, 4, 1.5, 1.3, 1.7)
    b = Candidate("b", 0.0, 2, 1.5, 1.4, 1.6)
    c = Candidate("c", 0.0, 3, 1.5, 1.4, 1.6)
    assert [x.run_id for x in advise([a, b, c]).ranked] == ["b", "c", "a"]


def test_json_shape_round_trips() -> None:
    (advice,) = advise_sweep([block(None, 0.5, (1.2, 1.1, 1.3)), block(3, 0.5, None, needed=7)])
    data = advice.to_dict()
    assert data["decision"] == "enable" and data["best"]["k"] is None
    assert data["insufficient"] == [
        {
            "run_id": "k3-t0.5",
            "temperature": 0.5,
            "k": 3,
            "n_needed": {"speculative": 7, "baseline": 0},
        }
    ]
    assert "k=?, T=0.5" in data["message"]
    assert load_label({"rate": None, "concurrency": None}) is None


def test_advice_from_measured_samples_picks_the_faster_arm() -> None:
    """End to end with the harness's own CI code: synthetic per-request latencies (emulated
    token counts x per-token times, no clock) for three k settings; the k whose speculative
    arm is truly 1.5x faster is named, and the one truly 0.8x is ranked last."""
    from specproxy.bench.summary import BENCH_STATISTICS
    from specproxy.stats.estimate.blockboot import value_speedup_intervals

    rng = np.random.default_rng(3)
    tokens = rng.integers(64, 256, size=600).astype(np.float64)
    base = tokens * 0.010 * rng.lognormal(0.0, 0.1, size=tokens.size)
    sweep = []
    for k, factor in ((2, 1.2), (4, 1.5), (8, 0.8)):
        spec = tokens * 0.010 / factor * rng.lognormal(0.0, 0.1, size=tokens.size)
        cis = value_speedup_intervals(
            base, spec, statistics=BENCH_STATISTICS, rng=rng, resamples=500
        )
        sweep.append(
            block(k, 0.0, None)
            | {"speedups": {"e2e": {"median": {"status": "ok", **cis["median"].to_dict()}}}}
        )
    (advice,) = advise_sweep(sweep)
    assert advice.decision == "enable"
    assert [c.k for c in advice.ranked] == [4, 2, 8]
    assert advice.best is not None and advice.best.lower > 1.0
    assert advice.ranked[-1].upper < 1.0


def test_k_and_temperature_sweep_also_advises_per_temperature() -> None:
    sweep = [
        block(2, 0.0, (1.30, 1.22, 1.41)),
        block(4, 0.0, (1.60, 1.50, 1.70)),
        block(2, 1.0, (0.97, 0.75, 1.52)),
        block(4, 1.0, (0.82, 0.74, 0.90)),
        block(8, 1.0, None, needed=12),
    ]
    (advice,) = advise_sweep(sweep)
    assert advice.best is not None and (advice.best.k, advice.best.temperature) == (4, 0.0)
    cold, hot = advice.by_temperature
    assert cold.decision == "enable" and cold.best is not None and cold.best.k == 4
    assert cold.distinguishable is True
    # at T=1 nothing is shown faster: k=2's CI includes 1, k=4's lies below it
    assert hot.decision == "inconclusive" and hot.best is not None and hot.best.k == 2
    assert [i.k for i in hot.insufficient] == [8]
    assert [a["decision"] for a in advice.to_dict()["by_temperature"]] == [
        "enable",
        "inconclusive",
    ]
    from specproxy.bench.cli import advice_lines

    lines = advice_lines([advice])
    assert lines[-2].startswith("  at T=0: enable speculation with k=4, T=0")
    assert lines[-1].startswith("  at T=1: inconclusive")


def test_one_varying_dimension_gives_no_per_temperature_split() -> None:
    temperatures_only = [block(4, 0.0, (1.3, 1.2, 1.4)), block(4, 1.0, (1.1, 1.0, 1.2))]
    ks_only = [block(2, 0.0, (1.3, 1.2, 1.4)), block(4, 0.0, (1.1, 1.0, 1.2))]
    one_run = advise_sweep(temperatures_only)[0]
    assert one_run.by_temperature == [] and "own run" not in one_run.message  # one k: one run
    assert advise_sweep(ks_only)[0].by_temperature == []
