"""Timing physics of an emulated vLLM engine: why speculation wins at low load and loses at high.

Everything here is pure (no I/O, no clock): the server feeds the real clock in, `simulate` feeds a
virtual one, so the same physics serves live traffic and offline predictions.

The model, per engine step (continuous batching: one step advances every running sequence):

    target(n)  = base_step_s * (1 + batch_slope * max(0, n - free_batch_tokens))
    step_s     = target(B * (1 + k))                # verify k drafts + 1 bonus per sequence
               + k * c * target(B)                  # k draft forwards, c times a target's each
               + prefill_per_token_s * P * (1 + c)  # prompts admitted this step (draft's too)
    step_s    *= slowdown * time_scale * (1 + (warmup_factor - 1) * warm_fraction)

B is the number of decoding sequences, P the prompt tokens admitted this step and k = 0 on the
baseline arm. `target` is a roofline: below `free_batch_tokens` a forward pass is memory-bound and
costs the same whatever the batch (so verifying k+1 tokens is free at low load, the premise of
speculative decoding); above it the pass is compute-bound and cost grows with every token.

Acceptance: each sequence draws its own rate alpha_r from a Beta distribution with mean
`acceptance` and standard deviation `acceptance_spread`. In a step, draft positions are accepted
left to right with probability alpha_r until the first rejection, so a step emits j + 1 tokens
(j accepted drafts + the target's bonus token), with E[j + 1] = (1 - a^(k+1)) / (1 - a).

Consequences (tested): at concurrency 1 every step costs base*(1 + k*c) and emits E[j + 1] tokens,
so the decode-time (TPOT) speedup is Leviathan et al.'s (1 - a^(k+1)) / ((1 - a)(k*c + 1)). Prefill
is not sped up (it is slightly slower, by the draft's prefill), so E2E speedup is lower. Under high
load B*(k+1) passes the roofline knee: the target pays for every rejected draft and speculation
loses. The first `warmup_requests` finished sequences after a (re)start run slower, falling
linearly from `warmup_factor` times to 1 (graph capture, allocator and cache warm-up).
"""

from __future__ import annotations

import math
import random
import statistics
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

__all__ = [
    "Engine",
    "Physics",
    "SeqOutput",
    "Sequence",
    "SimulationResult",
    "StepPlan",
    "StepResult",
    "closed_loop",
    "crossover_concurrency",
    "expected_tokens_per_step",
    "leviathan_speedup",
    "open_loop",
    "simulate",
    "steady_state",
    "tpot_of",
]

FinishReason = str  # "length" | "stop" | "abort"


def expected_tokens_per_step(acceptance: float, k: int) -> float:
    """E[tokens emitted per speculative step] = (1 - a^(k+1)) / (1 - a)."""
    if acceptance >= 1.0:
        return float(k + 1)
    return (1.0 - acceptance ** (k + 1)) / (1.0 - acceptance)


def leviathan_speedup(acceptance: float, k: int, draft_cost_ratio: float) -> float:
    """Expected walltime improvement of speculative decoding (Leviathan et al. 2023, eq. 1)."""
    return expected_tokens_per_step(acceptance, k) / (k * draft_cost_ratio + 1.0)


@dataclass(frozen=True, slots=True)
class Physics:
    """The knobs of the timing model (seconds); see the module docstring for the formulas."""

    speculative: bool = False
    num_speculative_tokens: int = 4
    acceptance: float = 0.7
    acceptance_spread: float = 0.05
    draft_cost_ratio: float = 0.1
    base_step_s: float = 0.010
    free_batch_tokens: int = 64
    batch_slope: float = 1.0 / 64.0
    prefill_per_token_s: float = 0.0001
    warmup_requests: int = 8
    warmup_factor: float = 4.0
    slowdown: float = 1.0
    time_scale: float = 1.0

    def __post_init__(self) -> None:
        checks = (
            (self.num_speculative_tokens >= 1, "num_speculative_tokens must be >= 1"),
            (0.0 <= self.acceptance <= 1.0, "acceptance must be in [0, 1]"),
            (0.0 <= self.acceptance_spread < 0.5, "acceptance_spread must be in [0, 0.5)"),
            (self.draft_cost_ratio >= 0.0, "draft_cost_ratio must be >= 0"),
            (self.base_step_s > 0.0, "base_step_s must be > 0"),
            (self.free_batch_tokens >= 1, "free_batch_tokens must be >= 1"),
            (self.batch_slope >= 0.0, "batch_slope must be >= 0"),
            (self.prefill_per_token_s >= 0.0, "prefill_per_token_s must be >= 0"),
            (self.warmup_requests >= 0, "warmup_requests must be >= 0"),
            (self.warmup_factor >= 1.0, "warmup_factor must be >= 1"),
            (self.slowdown > 0.0, "slowdown must be > 0"),
            (self.time_scale > 0.0, "time_scale must be > 0"),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)

    @property
    def k(self) -> int:
        """Draft tokens per step; 0 on the baseline arm."""
        return self.num_speculative_tokens if self.speculative else 0

    def target_forward_s(self, tokens: int) -> float:
        """One target forward pass over `tokens` batched tokens (roofline: flat, then linear)."""
        excess = max(0, tokens - self.free_batch_tokens)
        return self.base_step_s * (1.0 + self.batch_slope * excess)

    def step_s(self, decoding: int, prefill_tokens: int, warm_fraction: float = 0.0) -> float:
        """Duration of one engine step with `decoding` sequences and `prefill_tokens` new prompt."""
        k = self.k
        c = self.draft_cost_ratio if self.speculative else 0.0
        seconds = self.target_forward_s(decoding * (1 + k))
        if decoding and k:
            seconds += k * c * self.target_forward_s(decoding)
        seconds += self.prefill_per_token_s * prefill_tokens * (1.0 + c)
        warm = 1.0 + (self.warmup_factor - 1.0) * min(1.0, max(0.0, warm_fraction))
        return seconds * self.slowdown * self.time_scale * warm

    def expected_speedup(self) -> float:
        """Leviathan's formula for this arm's knobs (meaningful on the speculative arm)."""
        return leviathan_speedup(
            self.acceptance, self.num_speculative_tokens, self.draft_cost_ratio
        )

    def draw_alpha(self, rng: random.Random) -> float:
        """A per-sequence acceptance rate: Beta with the configured mean and spread."""
        mean, sd = self.acceptance, self.acceptance_spread
        if sd == 0.0 or mean <= 0.0 or mean >= 1.0:
            return mean
        var = min(sd * sd, 0.99 * mean * (1.0 - mean))
        concentration = mean * (1.0 - mean) / var - 1.0
        return rng.betavariate(mean * concentration, (1.0 - mean) * concentration)


def _uniform_token(rng: random.Random) -> int:
    return rng.randrange(2048)


@dataclass(eq=False, slots=True)
class Sequence:
    """One output sequence (a request has n of them per prompt) and its timing history."""

    request_id: str
    index: int
    prompt_tokens: int
    max_tokens: int
    arrival: float
    token_rng: random.Random
    accept_rng: random.Random
    stop_after: int | None = None  # emulated EOS: finish with "stop" after this many tokens
    alpha: float = 0.0
    generated: int = 0
    scheduled_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    finished_at: float | None = None
    finish_reason: FinishReason | None = None
    spec_steps: int = 0
    accepted: int = 0
    drafted: int = 0
    histogram: list[int] = field(default_factory=list)

    @property
    def limit(self) -> int:
        return self.max_tokens if self.stop_after is None else min(self.max_tokens, self.stop_after)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(frozen=True, slots=True)
class SeqOutput:
    """What one sequence emitted in one step: one SSE event's worth of tokens."""

    seq: Sequence
    token_ids: tuple[int, ...]
    finish_reason: FinishReason | None
    gap_s: float  # time since this sequence's previous output (the step's inter-token latency)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """A step the scheduler has committed to: who runs and how long it takes."""

    start: float
    duration_s: float
    prefill: tuple[Sequence, ...]
    decode: tuple[Sequence, ...]
    k: int = 0  # draft tokens per decoding sequence

    @property
    def scheduled_tokens(self) -> int:
        """Tokens the target processes (vLLM's iteration_tokens_total)."""
        return sum(s.prompt_tokens for s in self.prefill) + len(self.decode) * (1 + self.k)


@dataclass(frozen=True, slots=True)
class StepResult:
    """Outputs of a finished step and the counters vLLM's spec-decode metrics add up."""

    outputs: tuple[SeqOutput, ...]
    finished: tuple[Sequence, ...]
    prefill_tokens: int
    scheduled_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: tuple[int, ...] = ()


class Engine:
    """Continuous-batching scheduler over `Physics`: plan a step, wait its duration, complete it.

    The caller owns time: `plan(now)` says how long the step takes; `complete(plan, now)` is called
    when that time has passed (on the wall clock in the server, a virtual one in `simulate`).
    """

    def __init__(
        self,
        physics: Physics,
        *,
        max_num_seqs: int = 256,
        draw_token: Callable[[random.Random], int] = _uniform_token,
    ) -> None:
        self.physics = physics
        self.max_num_seqs = max_num_seqs
        self.draw_token = draw_token
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.finished_count = 0

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def warm_fraction(self) -> float:
        """1 right after start, falling to 0 once `warmup_requests` sequences have finished."""
        n = self.physics.warmup_requests
        return 0.0 if n == 0 else max(0.0, 1.0 - self.finished_count / n)

    def add(self, seq: Sequence) -> None:
        if self.physics.speculative:
            seq.alpha = self.physics.draw_alpha(seq.accept_rng)
        self.waiting.append(seq)

    def abort(self, request_id: str, now: float) -> list[Sequence]:
        """Drop a request's unfinished sequences (client went away); returns them."""
        dropped = [s for s in (*self.waiting, *self.running) if s.request_id == request_id]
        for seq in dropped:
            seq.finish_reason = "abort"
            seq.finished_at = now
        self.waiting = deque(s for s in self.waiting if s.request_id != request_id)
        self.running = [s for s in self.running if s.request_id != request_id]
        return dropped

    def plan(self, now: float) -> StepPlan | None:
        """Admit waiting sequences up to `max_num_seqs` and price the step; None when idle."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            seq = self.waiting.popleft()
            seq.scheduled_at = max(now, seq.arrival)
            self.running.append(seq)
        if not self.running:
            return None
        # Derived from state, not from "admitted just now": a plan never completed strands nobody.
        prefill = [s for s in self.running if s.generated == 0]
        decode = tuple(s for s in self.running if s.generated > 0)
        prompt = sum(s.prompt_tokens for s in prefill)
        duration = self.physics.step_s(len(decode), prompt, self.warm_fraction)
        return StepPlan(now, duration, tuple(prefill), decode, self.physics.k)

    def complete(self, plan: StepPlan, now: float) -> StepResult:
        """Emit the step's tokens (at time `now`) and retire finished sequences."""
        k = self.physics.k
        outputs: list[SeqOutput] = []
        finished: list[Sequence] = []
        per_pos = [0] * k
        num_drafts = num_accepted = 0
        for seq in (*plan.prefill, *plan.decode):
            if seq.finished:  # aborted while the step ran
                continue
            count = 1
            if seq.generated > 0 and k:
                accepted = 0
                while accepted < k and seq.accept_rng.random() < seq.alpha:
                    accepted += 1
                for pos in range(accepted):
                    per_pos[pos] += 1
                num_drafts += 1
                num_accepted += accepted
                seq.spec_steps += 1
                seq.accepted += accepted
                seq.drafted += k
                if not seq.histogram:
                    seq.histogram = [0] * (k + 1)
                seq.histogram[accepted] += 1
                count = accepted + 1
            count = min(count, seq.limit - seq.generated)
            tokens = tuple(self.draw_token(seq.token_rng) for _ in range(count))
            gap = now - (seq.last_token_at if seq.last_token_at is not None else plan.start)
            if seq.first_token_at is None:
                seq.first_token_at = now
            seq.last_token_at = now
            seq.generated += count
            if seq.generated >= seq.limit:
                eos = seq.stop_after is not None and seq.stop_after < seq.max_tokens
                seq.finish_reason = "stop" if eos else "length"
                seq.finished_at = now
                finished.append(seq)
            outputs.append(SeqOutput(seq, tokens, seq.finish_reason, gap))
        if finished:
            done = set(map(id, finished))
            self.running = [s for s in self.running if id(s) not in done]
            self.finished_count += len(finished)
        return StepResult(
            outputs=tuple(outputs),
            finished=tuple(finished),
            prefill_tokens=sum(s.prompt_tokens for s in plan.prefill),
            scheduled_tokens=plan.scheduled_tokens,
            num_drafts=num_drafts,
            num_draft_tokens=num_drafts * k,
            num_accepted=num_accepted,
            accepted_per_pos=tuple(per_pos),
        )


@dataclass(frozen=True, slots=True)
class SimulationResult:
    """Means over the finished requests of a closed-loop simulation (seconds)."""

    requests: int
    ttft_s: float
    tpot_s: float
    e2e_s: float
    tokens_per_step: float


def closed_loop(
    physics: Physics,
    *,
    concurrency: int,
    requests: int,
    prompt_tokens: int = 32,
    max_tokens: int = 128,
    seed: int = 0,
    start: float = 0.0,
) -> tuple[list[Sequence], int]:
    """A closed-loop run on a virtual clock from `start`: `concurrency` clients, each sends again
    on completion. The finished sequences (each with its own timings) and the decode steps."""
    if concurrency < 1 or requests < 1 or max_tokens < 2:
        raise ValueError("concurrency, requests must be >= 1 and max_tokens >= 2")
    engine = Engine(physics, max_num_seqs=max(256, concurrency))
    now = start
    sent = 0

    def send() -> None:
        nonlocal sent
        rng = random.Random(f"{seed}/{sent}")
        engine.add(Sequence(str(sent), 0, prompt_tokens, max_tokens, now, rng, rng))
        sent += 1

    for _ in range(min(concurrency, requests)):
        send()
    done: list[Sequence] = []
    steps = 0
    while engine.has_work:
        plan = engine.plan(now)
        if plan is None:
            break
        now += plan.duration_s
        result = engine.complete(plan, now)
        steps += len(plan.decode)
        for seq in result.finished:
            done.append(seq)
            if sent < requests:
                send()
    return done, steps


def open_loop(
    physics: Physics,
    requests: Iterable[tuple[float, int, int]],
    *,
    max_num_seqs: int = 256,
    seed: int = 0,
) -> list[Sequence]:
    """An open-loop run on a virtual clock, as the emulator's server schedules it: each request
    (arrival, prompt tokens, max tokens) arrives at its time whatever the engine's state; a step
    is never cut short, so what arrives during it is admitted by the next one (up to
    `max_num_seqs`, the rest waits); an idle engine starts at the next arrival. The finished
    sequences, each with its own timings."""
    pending = sorted(requests)
    engine = Engine(physics, max_num_seqs=max_num_seqs)
    done: list[Sequence] = []
    now = pending[0][0] if pending else 0.0
    i = 0
    while i < len(pending) or engine.has_work:
        while i < len(pending) and pending[i][0] <= now:
            arrival, prompt_tokens, max_tokens = pending[i]
            rng = random.Random(f"{seed}/{i}")
            engine.add(Sequence(str(i), 0, prompt_tokens, max_tokens, arrival, rng, rng))
            i += 1
        plan = engine.plan(now)
        if plan is None:
            now = pending[i][0]  # idle: the next arrival wakes it
            continue
        now += plan.duration_s
        done.extend(engine.complete(plan, now).finished)
    return done


def steady_state(done: list[Sequence], concurrency: int) -> list[Sequence]:
    """The sequences of a closed loop that ran at its full concurrency throughout: after the
    first 2 x `concurrency` (the first wave is sent and prefilled together, and the next is
    still in step with it) and finished by the last send (after it the clients stop, and the
    load falls)."""
    last_send = max((s.arrival for s in done), default=0.0)
    return [
        s
        for s in done[2 * concurrency :]
        if s.finished_at is not None and s.finished_at <= last_send
    ]


def tpot_of(seq: Sequence) -> float | None:
    """The sequence's time per output token after the first (None: fewer than 2 tokens)."""
    if seq.last_token_at is None or seq.first_token_at is None or seq.generated < 2:
        return None
    return (seq.last_token_at - seq.first_token_at) / (seq.generated - 1)


def simulate(
    physics: Physics,
    *,
    concurrency: int,
    requests: int,
    prompt_tokens: int = 32,
    max_tokens: int = 128,
    seed: int = 0,
) -> SimulationResult:
    """Closed-loop run on a virtual clock: `concurrency` clients, each sends again on completion."""
    done, steps = closed_loop(
        physics,
        concurrency=concurrency,
        requests=requests,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        seed=seed,
    )
    ttft = [s.first_token_at - s.arrival for s in done if s.first_token_at is not None]
    e2e = [s.finished_at - s.arrival for s in done if s.finished_at is not None]
    tpot = [
        (s.last_token_at - s.first_token_at) / (s.generated - 1)
        for s in done
        if s.last_token_at is not None and s.first_token_at is not None and s.generated > 1
    ]
    decoded = sum(s.generated - 1 for s in done)
    return SimulationResult(
        requests=len(done),
        ttft_s=statistics.fmean(ttft),
        tpot_s=statistics.fmean(tpot),
        e2e_s=statistics.fmean(e2e),
        tokens_per_step=decoded / steps if steps else math.nan,
    )


def crossover_concurrency(
    speculative: Physics,
    baseline: Physics,
    *,
    low: int = 1,
    high: int = 256,
    requests: int = 2000,
    prompt_tokens: int = 32,
    max_tokens: int = 128,
) -> float | None:
    """The concurrency at which the speculative arm's TPOT stops beating the baseline's, from
    this model on a virtual clock: the geometric-mean TPOT ratio (baseline / speculative) of the
    steady state (`steady_state`) at integer concurrencies, bisected to where it falls through 1
    and interpolated linearly between the two neighbours. None when it does not fall through 1
    in [low, high]."""

    def log_ratio(c: int) -> float:
        def mean_log_tpot(p: Physics) -> float:
            done, _ = closed_loop(
                p,
                concurrency=c,
                requests=requests,
                prompt_tokens=prompt_tokens,
                max_tokens=max_tokens,
            )
            tpots = [tpot_of(s) for s in steady_state(done, c)]
            return statistics.fmean(math.log(t) for t in tpots if t is not None)

        return mean_log_tpot(baseline) - mean_log_tpot(speculative)

    lo_y, hi_y = log_ratio(low), log_ratio(high)
    if lo_y <= 0 or hi_y > 0:
        return None
    while high - low > 1:
        mid = (low + high) // 2
        y = log_ratio(mid)
        if y > 0:
            low, lo_y = mid, y
        else:
            high, hi_y = mid, y
    return low + lo_y / (lo_y - hi_y)
