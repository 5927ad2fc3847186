"""The guarded ramp's latency guard: the verdicts' own anytime-valid tests, on the current step.

Within one step of the ramp the treatment's share is constant, so both arms' requests are spread
over the same minutes in the same proportion and their pooled distributions carry the same load
mix: a comparison within the step is unbiased however the load drifts. Pooled over the steps it
is not: the treatment's requests crowd into the late, high-share minutes, so a load that grows
over the run makes an A/A treatment look slower (tests/stats/test_rampguard.py measures it). The
guard therefore runs `stats.anytime.verdict.evidence` and a `DecisionMemory` of its own on the
step's samples only, at alpha / steps (a union bound over the schedule's steps, so the ramp's
false-cut probability over the whole run stays <= alpha), and the ramp reads the `Sequential`
block it returns exactly as the verdicts read theirs (`control.ramp.guards`).
"""

from __future__ import annotations

from specproxy.stats import result as schema
from specproxy.stats.anytime.decision import DecisionMemory
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.sample import ArmSample

__all__ = ["StepGuard"]


class StepGuard:
    """One treatment arm's latency guard over the ramp: `look` once per tick with the samples
    since its step began; a new step (`basis`: the id of the event that set it) starts afresh."""

    def __init__(self, *, alpha: float, tolerance: float, steps: int) -> None:
        if steps < 1:
            raise ValueError("steps must be >= 1")
        self.alpha = alpha / steps
        self.tolerance = tolerance
        self._memory = DecisionMemory()
        self._basis: int | None = None

    def look(
        self, control: ArmSample, treatment: ArmSample, *, basis: int, at: float
    ) -> schema.Sequential | None:
        """The step's E2E evidence held across its ticks (None: an arm has no samples yet)."""
        if basis != self._basis:
            self._memory, self._basis = DecisionMemory(), basis
        if control.n == 0 or treatment.n == 0:
            return None
        now = evidence(control, treatment, alpha=self.alpha, tolerance=self.tolerance)
        held = self._memory.recall(("", "step", "e2e"), now, at=at, span_s=None)
        return held.to_result()
