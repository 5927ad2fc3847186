"""The timing physics on a virtual clock: Leviathan at low load, losses at high load, batching."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from specproxy.emulator.model import (
    Engine,
    Physics,
    Sequence,
    expected_tokens_per_step,
    leviathan_speedup,
    simulate,
)

SPEC = Physics(speculative=True, warmup_requests=0)
BASE = dataclasses.replace(SPEC, speculative=False)


def seq(name: str, max_tokens: int = 16, prompt: int = 8, seed: int = 0) -> Sequence:
    return Sequence(
        name, 0, prompt, max_tokens, 0.0, random.Random(f"t{seed}"), random.Random(f"a{seed}")
    )


def run_to_end(engine: Engine) -> list[tuple[str, tuple[int, ...]]]:
    now = 0.0
    outputs: list[tuple[str, tuple[int, ...]]] = []
    for _ in range(10_000):
        if (plan := engine.plan(now)) is None:
            return outputs
        now += plan.duration_s
        outputs += [(o.seq.request_id, o.token_ids) for o in engine.complete(plan, now).outputs]
    raise AssertionError("the engine never went idle")


def test_formula_edges() -> None:
    assert expected_tokens_per_step(0.0, 4) == 1.0
    assert expected_tokens_per_step(1.0, 4) == 5.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)
    assert leviathan_speedup(0.7, 4, 0.1) == pytest.approx((1 - 0.7**5) / (0.3 * 1.4))
    assert SPEC.expected_speedup() == leviathan_speedup(0.7, 4, 0.1)


def test_target_forward_is_a_roofline() -> None:
    p = Physics(base_step_s=0.01, free_batch_tokens=64, batch_slope=1 / 64)
    assert p.target_forward_s(1) == p.target_forward_s(64) == 0.01
    assert p.target_forward_s(128) == pytest.approx(0.02)
    assert p.target_forward_s(320) == pytest.approx(0.05)


def test_step_cost_at_batch_one_is_one_target_plus_k_drafts() -> None:
    assert SPEC.step_s(1, 0) == pytest.approx(SPEC.base_step_s * (1 + 4 * 0.1))
    assert BASE.step_s(1, 0) == pytest.approx(BASE.base_step_s)
    assert BASE.step_s(0, 100) == pytest.approx(BASE.base_step_s + 100 * BASE.prefill_per_token_s)
    assert SPEC.step_s(1, 0, warm_fraction=1.0) == pytest.approx(4 * SPEC.step_s(1, 0))
    assert dataclasses.replace(SPEC, slowdown=3).step_s(2, 5) == pytest.approx(
        3 * SPEC.step_s(2, 5)
    )


def test_concurrency_one_matches_leviathan() -> None:
    spec = simulate(SPEC, concurrency=1, requests=400, max_tokens=128, seed=1)
    base = simulate(BASE, concurrency=1, requests=400, max_tokens=128, seed=1)
    tpot_speedup = base.tpot_s / spec.tpot_s
    assert tpot_speedup == pytest.approx(SPEC.expected_speedup(), rel=0.03)
    assert spec.tokens_per_step == pytest.approx(expected_tokens_per_step(0.7, 4), rel=0.03)
    assert base.e2e_s / spec.e2e_s < tpot_speedup  # prefill is not sped up


def test_e2e_gap_grows_with_prompt_length() -> None:
    def e2e_speedup(prompt: int) -> float:
        base = simulate(BASE, concurrency=1, requests=50, max_tokens=64, prompt_tokens=prompt)
        spec = simulate(SPEC, concurrency=1, requests=50, max_tokens=64, prompt_tokens=prompt)
        return base.e2e_s / spec.e2e_s

    assert e2e_speedup(1000) < e2e_speedup(100) < e2e_speedup(10)


def test_speculation_loses_at_high_load() -> None:
    speedups = []
    for concurrency in (1, 16, 64):
        requests = 2 * concurrency + 32
        base = simulate(BASE, concurrency=concurrency, requests=requests, max_tokens=64)
        spec = simulate(SPEC, concurrency=concurrency, requests=requests, max_tokens=64)
        speedups.append(base.tpot_s / spec.tpot_s)
    assert speedups[0] > speedups[1] > speedups[2]
    assert speedups[0] > 1.5
    assert speedups[2] < 1.0


def test_batching_slows_everyone_once_past_the_knee() -> None:
    alone = simulate(BASE, concurrency=1, requests=8, max_tokens=32)
    crowded = simulate(BASE, concurrency=256, requests=256, max_tokens=32)
    assert crowded.tpot_s > 2 * alone.tpot_s


def test_one_output_per_sequence_per_step_and_exact_lengths() -> None:
    engine = Engine(SPEC)
    for i in range(3):
        engine.add(seq(str(i), max_tokens=10 + i, seed=i))
    now = 0.0
    totals = {"0": 0, "1": 0, "2": 0}
    for _ in range(1000):
        if (plan := engine.plan(now)) is None:
            break
        now += plan.duration_s
        result = engine.complete(plan, now)
        names = [o.seq.request_id for o in result.outputs]
        assert len(names) == len(set(names))
        for out in result.outputs:
            assert 1 <= len(out.token_ids) <= 5
            totals[out.seq.request_id] += len(out.token_ids)
        assert sum(result.accepted_per_pos) == result.num_accepted
        assert result.num_draft_tokens == 4 * result.num_drafts
    assert totals == {"0": 10, "1": 11, "2": 12}
    assert engine.finished_count == 3


def test_a_sequence_is_the_same_alone_or_batched() -> None:
    alone = Engine(SPEC)
    alone.add(seq("x", max_tokens=40, seed=5))
    batched = Engine(SPEC)
    for i in range(6):
        batched.add(seq("x" if i == 3 else f"o{i}", max_tokens=40, seed=5 if i == 3 else i))
    tokens_alone = [t for _, ids in run_to_end(alone) for t in ids]
    tokens_batched = [t for name, ids in run_to_end(batched) if name == "x" for t in ids]
    assert tokens_alone == tokens_batched


def test_max_num_seqs_queues_the_rest_and_abort_drops() -> None:
    engine = Engine(BASE, max_num_seqs=2)
    for i in range(4):
        engine.add(seq(str(i)))
    plan = engine.plan(0.0)
    assert plan is not None and len(plan.prefill) == 2 and len(engine.waiting) == 2
    dropped = engine.abort("3", now=0.0)
    assert [s.finish_reason for s in dropped] == ["abort"]
    assert len(engine.waiting) == 1


def test_warm_up_fades_over_the_first_requests() -> None:
    engine = Engine(dataclasses.replace(BASE, warmup_requests=2))
    assert engine.warm_fraction == 1.0
    engine.add(seq("a", max_tokens=2))
    first = engine.plan(0.0)
    assert first is not None
    assert first.duration_s == pytest.approx(BASE.step_s(0, 8, warm_fraction=1.0))
    run_to_end(engine)
    assert engine.warm_fraction == 0.5
    engine.add(seq("b", max_tokens=2))
    run_to_end(engine)
    assert engine.warm_fraction == 0.0


def test_per_request_acceptance_varies_around_the_mean() -> None:
    rng = random.Random(0)
    alphas = [SPEC.draw_alpha(rng) for _ in range(2000)]
    assert sum(alphas) / len(alphas) == pytest.approx(0.7, abs=0.01)
    assert len(set(alphas)) > 1000
    fixed = dataclasses.replace(SPEC, acceptance_spread=0.0)
    assert fixed.draw_alpha(rng) == 0.7


@pytest.mark.parametrize(
    "bad",
    [
        {"acceptance": 1.5},
        {"num_speculative_tokens": 0},
        {"base_step_s": 0},
        {"warmup_factor": 0.5},
        {"slowdown": -1},
        {"acceptance_spread": 0.6},
    ],
)
def test_invalid_physics_is_refused(bad: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        dataclasses.replace(SPEC, **bad)
