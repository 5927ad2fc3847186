"""The demo's load against the emulated arms' capacity, from the emulator's model (no clock)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from specproxy.config import StatsConfig, StoreConfig
from specproxy.demo.capacity import (
    DEMO_EVENT_BUDGET,
    DEMO_UTILISATION,
    OVERLOAD_FACTOR,
    events_per_request,
    overload_slowdown,
    saturation_rate,
    split_rate,
)
from specproxy.demo.runner import DemoOptions, emulated_loads, emulator_configs
from specproxy.emulator.model import Physics, open_loop, simulate
from specproxy.emulator.vocab import chat_prompt_ids
from specproxy.prompts import load_prompts
from specproxy.records import RequestRecord
from specproxy.stats.job.tick import compute_stats
from specproxy.store.memory import MemoryStore


@pytest.mark.parametrize(("speculative", "acceptance"), [(False, 0.8), (True, 0.8), (True, 0.5)])
def test_saturation_agrees_with_the_closed_loop_simulation(
    speculative: bool, acceptance: float
) -> None:
    # 256 clients keep a 256-sequence batch full: the simulation's throughput is the saturation
    physics = Physics(speculative=speculative, acceptance=acceptance, warmup_requests=0)
    run = simulate(physics, concurrency=256, requests=1024, prompt_tokens=40, max_tokens=64)
    served = 256 / run.e2e_s
    modelled = saturation_rate(physics, prompt_tokens=40, output_tokens=64, max_num_seqs=256)
    assert modelled == pytest.approx(served, rel=0.03)


def test_the_default_demo_load_stays_below_the_modelled_saturation() -> None:
    opts = DemoOptions()
    loads = emulated_loads(opts, load_prompts(None))
    spec, base = loads["speculative"], loads["baseline"]
    assert spec.rate + base.rate == opts.rate
    for arm in (spec, base):
        assert arm.utilisation <= DEMO_UTILISATION
    assert spec.events_per_s + base.events_per_s <= DEMO_EVENT_BUDGET
    # the old default (the prompts' own budgets, up to 512 tokens) was within the model's
    # saturation too but streamed three times the events
    old = emulated_loads(dataclasses.replace(opts, max_tokens=None), load_prompts(None))
    assert sum(a.events_per_s for a in old.values()) > 3 * DEMO_EVENT_BUDGET


def test_overload_slows_both_arms_until_the_slower_one_gets_more_than_it_serves() -> None:
    opts = DemoOptions()
    prompts = load_prompts(None)
    slowdown = overload_slowdown(list(emulated_loads(opts, prompts).values()))
    assert slowdown > 1.0
    loads = emulated_loads(opts, prompts, slowdown)
    spec, base = loads["speculative"], loads["baseline"]
    assert max(spec.utilisation, base.utilisation) == pytest.approx(OVERLOAD_FACTOR)
    assert min(spec.utilisation, base.utilisation) > 0.5  # both arms near or past saturation
    # the same requests, the same events: no more CPU than the healthy run
    assert spec.events_per_s == pytest.approx(
        emulated_loads(opts, prompts)["speculative"].events_per_s
    )


def test_events_per_request_count_the_prefill_token_and_one_per_step() -> None:
    assert events_per_request(Physics(), 64) == 64  # baseline: a token per event
    spec = Physics(speculative=True, acceptance=0.5, num_speculative_tokens=4)
    assert events_per_request(spec, 64) == pytest.approx(1 + 63 / 1.9375)


def test_split_rate_gives_each_arm_its_weight_over_the_sum() -> None:
    assert split_rate(12.0, {"baseline": 1, "ngram-k2": 1, "ngram-k4": 1}) == pytest.approx(
        {"baseline": 4.0, "ngram-k2": 4.0, "ngram-k4": 4.0}
    )
    assert split_rate(10.0, {"a": 3.0, "b": 1.0, "c": 0.0}) == {"a": 7.5, "b": 2.5, "c": 0.0}
    with pytest.raises(ValueError, match="weights"):
        split_rate(1.0, {"a": 0.0})


async def _demo_on_the_models_clock(opts: DemoOptions, slowdown: float) -> str:
    """The demo's headline (the whole run's diagnosis summary) for its load on the emulator's
    model, virtual clock: each arm's emulator settings (`emulator_configs`, slowed down as
    `--overload` slows them), Poisson arrivals at its share of `opts.rate` for
    `opts.duration_s`, the demo's prompts under its output cap (`open_loop`), every request
    recorded with its modelled timings and compared by the stats pipeline (`compute_stats`)."""
    prompts = load_prompts(None)
    lengths = [
        (len(chat_prompt_ids(p.messages)), min(p.max_tokens, opts.max_tokens or p.max_tokens))
        for p in prompts
    ]
    rates = split_rate(opts.rate, {arm: 1.0 for arm in emulator_configs(opts)})
    store = MemoryStore(StoreConfig(url="memory://"), run_id="demo")
    await store.start()
    t0 = 1_700_000_040.0  # a minute boundary
    for a, (arm, cfg) in enumerate(emulator_configs(opts, slowdown).items()):
        rng = np.random.default_rng(a)
        n = int(rng.poisson(rates[arm] * opts.duration_s))
        arrivals = np.sort(rng.uniform(0.0, opts.duration_s, n))
        picks = rng.integers(len(lengths), size=n)
        done = open_loop(
            cfg.physics(),
            [(float(t), *lengths[k]) for t, k in zip(arrivals, picks, strict=True)],
            max_num_seqs=cfg.max_num_seqs,
            seed=a,
        )
        for seq in done:
            assert seq.first_token_at is not None and seq.finished_at is not None
            last = seq.last_token_at or seq.first_token_at
            e2e = seq.finished_at - seq.arrival
            store.record(
                RequestRecord(
                    request_id=f"{arm}-{seq.request_id}",
                    run_id="demo",
                    arm=arm,
                    t_start=t0 + seq.arrival,
                    model="m",
                    endpoint="chat.completions",
                    stream=True,
                    status=200,
                    e2e_s=e2e,
                    upstream_s=e2e,
                    ttft_s=seq.first_token_at - seq.arrival,
                    tpot_s=(last - seq.first_token_at) / (seq.generated - 1),
                    prompt_tokens=seq.prompt_tokens,
                    output_tokens=seq.generated,
                )
            )
    await store.flush()
    result = await compute_stats(
        store,
        run_id="demo",
        stats_cfg=StatsConfig(windows_s=(None,), resamples=200),
        window_end=t0 + opts.duration_s,
    )
    await store.close()
    return str(result["results"]["all"]["all"]["diagnosis"]["summary"])


async def test_the_default_demo_is_not_overloaded_and_overload_gets_the_queueing_headline() -> None:
    """Issue 26, Done means: on a 2-core machine the demo's default load is not overloaded,
    proven by the emulator's own model (its capacity above, here its timings on a virtual clock,
    not the wall clock), and a run forced by `--overload` gets the headline that says the
    comparison is measuring queueing."""
    opts = DemoOptions()
    healthy = await _demo_on_the_models_clock(opts, 1.0)
    assert not healthy.startswith("overloaded"), healthy
    # the model's speculative prefill costs 1 + c: TTFT a little slower, TPOT 2.3x faster
    assert "speculation helps: TPOT median" in healthy, healthy
    slowdown = overload_slowdown(list(emulated_loads(opts, load_prompts(None)).values()))
    overloaded = await _demo_on_the_models_clock(opts, slowdown)
    assert overloaded.startswith(
        "overloaded: this comparison is measuring queueing, not speculation"
    ), overloaded
