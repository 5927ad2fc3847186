"""How much load the demo's emulated arms take, by the emulator's own timing model (pure).

An arm saturates when its engine is never idle: every step runs the full batch
(`max_num_seqs`), and requests arrive as fast as such steps finish them. By the model
(`emulator.model.Physics.step_s`), a request then costs

    decode:  step_s(B, 0) / B x (T - 1) / E    its share of (T - 1) / E full-batch steps
    prefill: step_s(0, P) - step_s(0, 0)       its prompt, added to the step that admits it

(T output tokens, the first from the prefill step; P prompt tokens; E expected tokens per step,
1 on the baseline, (1 - a^(k+1)) / (1 - a) on the speculative arm), and the arm serves
1 / (decode + prefill) requests per second: `saturation_rate`. Both costs are linear in T and P,
so the prompt set's mean lengths give its mean cost. A step's cost per sequence only falls as
the batch grows (flat below the roofline knee, constant above it), so the full batch is where
the arm serves most; the closed-loop `emulator.model.simulate` at 256 clients agrees within 3%
(tests/demo/test_capacity.py).

The model is not all that limits the demo, though: its emulators, proxy and load generator share
one Python event loop, which carries every streamed event three times (emulator, proxy, client).
One event per sequence per step, so the model also gives the event rate of a load
(`ArmLoad.events_per_s`). The default load keeps both within bounds: each arm at most
`DEMO_UTILISATION` of its modelled saturation, and at most `DEMO_EVENT_BUDGET` events per second
in all. The budget comes from the CPU time (not the latency) of a 30-second demo run on a 2-core
machine that other processes kept busy (load average 8): 16.8 s of CPU for about 16,000 events,
start-up, stats and report included, so at most ~1 ms per event across the three hops, and 600
events per second leave the loop room. At the old default (16 req/s with the prompts' own
budgets, 1,850 events per second) the loop fell behind, the emulated steps stretched (baseline
TPOT 97 ms where the model says 10) and the baseline's queue grew for the whole run.

`--overload` keeps the default load and slows both arms' steps alike (the emulator's `slowdown`
knob) until the slower arm's modelled saturation is the per-arm rate over `OVERLOAD_FACTOR`:
an overloaded run that costs no more CPU than a healthy one.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from specproxy.emulator.model import Physics, expected_tokens_per_step

__all__ = [
    "DEMO_EVENT_BUDGET",
    "DEMO_UTILISATION",
    "OVERLOAD_FACTOR",
    "ArmLoad",
    "arm_load",
    "events_per_request",
    "mean_lengths",
    "overload_slowdown",
    "saturation_rate",
    "split_rate",
]

DEMO_UTILISATION: Final = 0.5  # the default load's share of each arm's modelled saturation
DEMO_EVENT_BUDGET: Final = 600.0  # streamed events per second over both arms (see above)
OVERLOAD_FACTOR: Final = 1.5  # --overload: per-arm rate over the slower arm's saturation


def _tokens_per_step(physics: Physics) -> float:
    return expected_tokens_per_step(physics.acceptance, physics.k) if physics.k else 1.0


def saturation_rate(
    physics: Physics, *, prompt_tokens: float, output_tokens: float, max_num_seqs: int
) -> float:
    """Requests per second the arm serves at most, by its model (see the module docstring)."""
    batch = max_num_seqs
    decode = physics.step_s(batch, 0) / batch * max(0.0, output_tokens - 1.0)
    decode /= _tokens_per_step(physics)
    prefill = physics.step_s(0, round(prompt_tokens)) - physics.step_s(0, 0)
    return 1.0 / (decode + prefill)


def events_per_request(physics: Physics, output_tokens: float) -> float:
    """Streamed events of a request: the prefill step's token, then one per decode step."""
    return 1.0 + max(0.0, output_tokens - 1.0) / _tokens_per_step(physics)


def mean_lengths(
    prompt_lengths: Sequence[int], budgets: Sequence[int], cap: int | None
) -> tuple[float, float]:
    """(mean prompt tokens, mean output tokens) of a prompt set whose outputs are capped."""
    outputs = [min(b, cap) if cap is not None else b for b in budgets]
    return statistics.fmean(prompt_lengths), statistics.fmean(outputs)


@dataclass(frozen=True, slots=True)
class ArmLoad:
    """One arm under a Poisson load, by the model."""

    rate: float  # requests per second sent to the arm
    saturation: float  # requests per second it serves at most
    events_per_s: float  # streamed events per second at `rate`

    @property
    def utilisation(self) -> float:
        return self.rate / self.saturation


def arm_load(
    physics: Physics, rate: float, *, prompt_tokens: float, output_tokens: float, max_num_seqs: int
) -> ArmLoad:
    """The model's view of `rate` requests per second on one arm."""
    return ArmLoad(
        rate=rate,
        saturation=saturation_rate(
            physics,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            max_num_seqs=max_num_seqs,
        ),
        events_per_s=rate * events_per_request(physics, output_tokens),
    )


def split_rate(rate: float, weights: Mapping[str, float]) -> dict[str, float]:
    """Each arm's share of `rate` requests per second: its weight over the sum of the weights,
    as the proxy's weighted routing splits the traffic (`Config.arm_shares`)."""
    total = sum(weights.values())
    if total <= 0:
        raise ValueError("the arms' weights must not all be 0")
    return {arm: rate * weight / total for arm, weight in weights.items()}


def overload_slowdown(loads: Sequence[ArmLoad]) -> float:
    """The factor to slow every arm's steps by (alike) so that the most utilised arm of `loads`
    gets `OVERLOAD_FACTOR` times what it serves (saturation scales as 1 / slowdown); 1 when it
    does already."""
    return max(1.0, OVERLOAD_FACTOR / max(load.utilisation for load in loads))
