"""A guarded-ramp simulation against known-truth synthetic arms, on a virtual clock: one stats
tick per minute through the real decision code (`control.ramp.decide`, `guards`, the step's
`stats.rampguard.StepGuard` with its latency and error-rate guards, fed each minute's requests
as `stats.job.ramp` feeds it those that landed), the events folded as a replica does."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from specproxy.config import RampConfig
from specproxy.control.events import ArmEvent
from specproxy.control.ramp import Decision, RampPosition, decide, guard_event, guards
from specproxy.stats.job.ramp import DEFAULT_HORIZON_S
from specproxy.stats.rampguard import StepGuard, StepRows

FloatArray = npt.NDArray[np.float64]
Sampler = Callable[[np.random.Generator, int, float], FloatArray]

# control: log-normal E2E (median 1 s, sigma 0.5) times the minute's load factor
SIGMA = 0.5
P99_Z = 2.3263478740408408


def control_sampler(rng: np.random.Generator, n: int, load: float) -> FloatArray:
    return load * rng.lognormal(0.0, SIGMA, n)


def slower_p99(ratio: float) -> Sampler:
    """Same median, a P99 `ratio` x the control's (a wider log-normal)."""
    sigma = SIGMA + np.log(ratio) / P99_Z

    def sample(rng: np.random.Generator, n: int, load: float) -> FloatArray:
        return load * rng.lognormal(0.0, sigma, n)

    return sample


def faster(speedup: float) -> Sampler:
    def sample(rng: np.random.Generator, n: int, load: float) -> FloatArray:
        return load * rng.lognormal(0.0, SIGMA, n) / speedup

    return sample


def drifting_load(minute: int) -> float:
    """The load's latency factor: it doubles over the first 100 minutes."""
    return 1.0 + min(minute, 100) / 100.0


@dataclass
class RampRun:
    decisions: list[Decision] = field(default_factory=list)
    events: list[ArmEvent] = field(default_factory=list)
    treatment_requests: int = 0  # over the run
    step_requests_at_cut: int | None = None  # the treatment's requests in the step it was cut at
    requests_at_cut: int | None = None  # the treatment's requests over the run when cut

    @property
    def cut(self) -> bool:
        return any(d.move == "cut" for d in self.decisions)

    @property
    def final_weight(self) -> float:
        sets = [e.weight for e in self.events if e.weight is not None]
        return sets[-1] if sets else 0.0


def simulate(
    rng: np.random.Generator,
    treatment: Sampler,
    *,
    policy: RampConfig,
    rate_per_minute: int = 1000,
    error_rate: float = 0.01,
    treatment_error_rate: float | None = None,
    minutes: int = 120,
    alpha: float = 0.05,
    tolerance: float = 0.05,
    stay_at_final: int = 10,
) -> RampRun:
    run = RampRun()
    arm = "speculative"
    # as stats.job.ramp: alpha split between the latency and the error guard, each over the steps
    guard = StepGuard(
        alpha=alpha / 2, tolerance=tolerance, steps=len(policy.schedule), revise_s=DEFAULT_HORIZON_S
    )
    p_t = error_rate if treatment_error_rate is None else treatment_error_rate
    final_since: int | None = None
    for minute in range(minutes):
        pos = RampPosition.of(arm, 0.0, run.events, run_start=0.0)
        since = pos.since if pos.since is not None else 0.0  # a new step: its own time block
        guard.begin(since=since, basis=pos.basis)
        # this minute's traffic at the current share; each arm's errors are some of its
        # requests (their latency is drawn with the rest)
        load = drifting_load(minute)
        n_t = int(rng.binomial(rate_per_minute, pos.weight))
        n_c = rate_per_minute - n_t
        values = (control_sampler(rng, n_c, load), treatment(rng, n_t, load))
        run.treatment_requests += n_t
        errors = (int(rng.binomial(n_c, error_rate)), int(rng.binomial(n_t, p_t)))
        rows = [
            StepRows.of(
                np.full(v.size, minute - int(since // 60)), v, errored=np.arange(v.size) < k
            )
            for v, k in zip(values, errors, strict=True)
        ]
        # the tick at the minute's end, the minute's requests landed
        now = 60.0 * (minute + 1)
        guard.fold(rows[0], rows[1], until=now)
        look = guard.look(at=now)
        decision = decide(
            policy, pos, now=now, guards=guards(look.seq, look.errors), samples=look.samples
        )
        run.decisions.append(decision)
        event = guard_event(decision, run_id="sim", t=now)
        if event is not None and decision.still_valid(pos.basis):
            stored = ArmEvent(
                event.run_id,
                event.t,
                event.action,
                event.arm,
                event.weight,
                event.who,
                event.why,
                id=len(run.events) + 1,
            )
            run.events.append(stored)
        if decision.move == "cut":
            run.step_requests_at_cut = look.samples
            run.requests_at_cut = run.treatment_requests
            break
        if decision.step == len(policy.schedule) - 1 and decision.move == "hold":
            final_since = minute if final_since is None else final_since
            if minute - final_since >= stay_at_final:
                break
    return run
