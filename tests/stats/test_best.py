"""The best-configuration answer: known-truth runs with four arms whose true speedups differ
(the leader, its margin and "winner" once separated), and "no winner yet" while two
treatments are truly alike."""

from __future__ import annotations

import numpy as np

from specproxy.config import StatsConfig, StoreConfig, WarmupConfig
from specproxy.records import RequestRecord
from specproxy.stats.job.tick import compute_stats
from specproxy.stats.result import WindowResult
from specproxy.store.memory import MemoryStore

RUN = "abn"


def _records(speedups: dict[str, float], per_arm: int, seed: int) -> list[RequestRecord]:
    """Interleaved requests 0.05 s apart; every latency lognormal, divided by its arm's true
    speedup (so the true ratio of any statistic of two arms is the ratio of their speedups)."""
    rng = np.random.default_rng(seed)
    arms = list(speedups)
    out = []
    for i in range(per_arm * len(arms)):
        arm = arms[i % len(arms)]
        s = speedups[arm]
        e2e = rng.lognormal(np.log(2.0), 0.3) / s
        out.append(
            RequestRecord(
                request_id=f"q{i}",
                run_id=RUN,
                arm=arm,
                t_start=1000.0 + i * 0.05,
                model="m",
                endpoint="chat.completions",
                stream=True,
                status=200,
                e2e_s=e2e,
                upstream_s=e2e,
                ttft_s=rng.lognormal(np.log(0.1), 0.3) / s,
                tpot_s=rng.lognormal(np.log(0.02), 0.3) / s,
                prompt_tokens=50,
                output_tokens=100,
            )
        )
    return out


async def _window(speedups: dict[str, float], per_arm: int, seed: int) -> WindowResult:
    store = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await store.start()
    for rec in _records(speedups, per_arm, seed):
        store.record(rec)
    await store.flush()
    control, *treatments = speedups
    result = await compute_stats(
        store,
        run_id=RUN,
        stats_cfg=StatsConfig(windows_s=(None,), resamples=400),
        warmup=WarmupConfig(requests=0),
        control=control,
        treatments=treatments,
    )
    return result["results"]["all"]["all"]


async def test_four_arms_each_compared_and_the_true_best_named_once_separated() -> None:
    truth = {"base": 1.0, "k2": 1.15, "k4": 1.6, "eagle": 1.3}
    window = await _window(truth, per_arm=1500, seed=1)
    assert window["multiplicity"] == {
        "method": "bonferroni",
        "treatments": 3,
        "alpha": 0.05,
        "alpha_per_comparison": 0.05 / 3,
    }
    for treatment, comparison in window["comparisons"].items():
        median = comparison["metrics"]["e2e"]["speedup"]["median"]
        assert median["lower"] is not None and median["upper"] is not None
        assert median["lower"] < truth[treatment] < median["upper"], treatment
        assert comparison["metrics"]["e2e"]["verdict"] == "faster"
    best = window["best"]
    assert (best["state"], best["leader"], best["runner_up"]) == ("winner", "k4", "eagle")
    assert sorted(best["separated_from"]) == ["eagle", "k2"]
    margin = best["margin"]
    assert margin is not None and margin["lower"] is not None and margin["upper"] is not None
    assert margin["lower"] < 1.6 / 1.3 < margin["upper"]  # speedup(leader) / speedup(runner-up)


async def test_no_winner_while_the_two_best_are_truly_alike() -> None:
    window = await _window({"base": 1.0, "k2": 1.4, "k4": 1.4}, per_arm=800, seed=2)
    best = window["best"]
    assert best["state"] == "no_winner_yet" and best["leader"] in ("k2", "k4")
    assert "do not yet separate" in best["reason"]


async def test_one_treatment_is_the_two_arm_result_as_before() -> None:
    window = await _window({"baseline": 1.0, "speculative": 1.5}, per_arm=500, seed=3)
    assert window["treatments"] == ["speculative"] and window["best"]["state"] == "single"
    assert window["multiplicity"]["alpha_per_comparison"] == 0.05
    only = window["comparisons"]["speculative"]
    assert only["metrics"] == window["metrics"] and only["samples"] == window["samples"]
