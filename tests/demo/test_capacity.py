"""The demo's load against the emulated arms' capacity, from the emulator's model (no clock)."""

from __future__ import annotations

import dataclasses

import pytest

from specproxy.demo.capacity import (
    DEMO_EVENT_BUDGET,
    DEMO_UTILISATION,
    OVERLOAD_FACTOR,
    events_per_request,
    overload_slowdown,
    saturation_rate,
    split_rate,
)
from specproxy.demo.runner import DemoOptions, emulated_loads
from specproxy.emulator.model import Physics, simulate
from specproxy.prompts import load_prompts


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
