"""The guarded ramp against known-truth synthetic arms: when it cuts, whether it reaches the final
step, how often it cuts an A/A treatment, and why it compares within steps while load drifts.

Every run is `tests/stats/ramp_sim.simulate`: one stats tick per virtual minute, 1,000 requests a
minute split at the arm's current weight, through the production decision code (`control.ramp`,
the step's `stats.rampguard.StepGuard`: its latency and error-rate guards) with the job's alpha
split (latency and error guard at alpha / 2 each, over the schedule's steps), while the load's
latency factor doubles over the first 100 minutes. Control E2E: lognormal(0, 0.5) x load. The
policy is the default schedule 1% -> 5% -> 25% -> 50% with `min_samples` 200 and `min_minutes` 5.

1. A treatment with a 30% worse P99 (same median, wider log-normal): the treatment requests sent
   before the ramp cut it, against what the P99 test alone needs, i.e. the verdict's P99 test
   (`anytime.verdict.evidence` kept by `DecisionMemory`, at alpha) on a 50/50 split from the
   start: treatment requests until it first says slower.
2. 1.5x faster: the runs that reach the final step, and those cut at all.
3. A/A: the runs cut (any guard), to `--aa-minutes` minutes; allowed <= alpha.
4. Load drifting while the weight ramps (A/A, 25 minutes a step): the treatment / control E2E
   median ratio pooled over the whole ramp (the naive estimate) against the same ratio within
   each step (one share: the comparison the guard makes), the verdict's E2E median called
   "slower" pooled, and the step guard failing within steps; truth: 1.

    nice -n 10 .venv/bin/python -m benchmarks.study_ramp [--runs 100] [--seed 0]

prints the figures; asserts nothing (the asserted versions are tests/stats/test_rampguard.py).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import numpy as np
from tests.stats.ramp_sim import (
    RampRun,
    Sampler,
    control_sampler,
    drifting_load,
    faster,
    simulate,
    slower_p99,
)

from specproxy.config import RampConfig
from specproxy.stats.anytime.verdict import evidence
from specproxy.stats.job.ramp import DEFAULT_HORIZON_S
from specproxy.stats.rampguard import StepGuard, StepRows
from specproxy.stats.sample import ArmSample

__all__ = ["main", "p99_test_alone"]

POLICY = RampConfig(enabled=True, min_samples=200, min_minutes=5)
RATE = 1000  # requests a minute
ALPHA = 0.05
TOLERANCE = 0.05  # [stats] p99_tolerance's default


def p99_test_alone(
    rng: np.random.Generator,
    treatment: Sampler,
    *,
    alpha: float = ALPHA,
    share: float = 0.5,
    minutes: int = 600,
) -> int | None:
    """Treatment requests until the verdict's P99 test (at `alpha`, one look a minute, 50/50)
    first says slower; None: not within `minutes`."""
    guard = StepGuard(alpha=alpha, tolerance=TOLERANCE, steps=1, revise_s=DEFAULT_HORIZON_S)
    guard.begin(since=0.0, basis=1)
    n_t_total = 0
    for minute in range(minutes):
        load = drifting_load(minute)
        n_t = int(rng.binomial(RATE, share))
        c, t = control_sampler(rng, RATE - n_t, load), treatment(rng, n_t, load)
        n_t_total += n_t
        end = 60.0 * (minute + 1)
        guard.fold(*(StepRows.of(np.full(v.size, minute), v) for v in (c, t)), until=end)
        seq = guard.look(at=end).seq
        if seq is not None and seq["p99_slower"]:
            return n_t_total
    return None


def _quartiles(values: Sequence[float]) -> str:
    q1, q2, q3 = np.percentile(values, [25, 50, 75])
    return f"median {q2:,.0f} (quartiles {q1:,.0f}-{q3:,.0f})"


def _ramps(treatment: Sampler, runs: int, seed: int, minutes: int) -> list[RampRun]:
    """`runs` simulated ramps of `minutes` each (the final step held to the end)."""
    return [
        simulate(
            np.random.default_rng(seed + i),
            treatment,
            policy=POLICY,
            rate_per_minute=RATE,
            minutes=minutes,
            stay_at_final=minutes,
        )
        for i in range(runs)
    ]


def worse_p99(runs: int, seed: int) -> None:
    ramp, in_step, step_of_cut, minutes, p99_only = [], [], [], [], 0
    for run in _ramps(slower_p99(1.3), runs, seed, 600):
        if run.cut and run.requests_at_cut is not None:
            ramp.append(run.requests_at_cut)
            in_step.append(run.step_requests_at_cut or 0)
            cut_weight = [e.weight for e in run.events][-2]
            step_of_cut.append(POLICY.schedule.index(cut_weight) + 1)
            minutes.append(len(run.decisions))
            p99_only += run.decisions[-1].why.startswith("cut: E2E P99 slower")
    guard_alpha = ALPHA / 2 / len(POLICY.schedule)  # the ramp's latency guard, per step
    alone, alone_guard = (
        [
            n
            for i in range(runs)
            if (
                n := p99_test_alone(
                    np.random.default_rng(seed + 10_000 + i), slower_p99(1.3), alpha=alpha
                )
            )
            is not None
        ]
        for alpha in (ALPHA, guard_alpha)
    )
    print("1. 30% worse P99 (same median):")
    print(
        f"   ramp cut it in {len(ramp)}/{runs} runs after {_quartiles(ramp)} treatment requests,"
        f" {_quartiles(minutes)} minutes; the cut's step: "
        + ", ".join(f"{k}: {step_of_cut.count(k)}" for k in sorted(set(step_of_cut)))
        + f"; the P99 guard among the reasons in {p99_only}/{len(ramp)};"
        f" {_quartiles(in_step)} of the requests within the step it was cut at"
    )
    print(
        f"   the P99 test alone (alpha {ALPHA}, 50/50) said slower in {len(alone)}/{runs} runs"
        f" after {_quartiles(alone)} treatment requests"
    )
    print(
        f"   the same test at the guard's level (alpha {guard_alpha:g}) in {len(alone_guard)}/"
        f"{runs} runs after {_quartiles(alone_guard)} treatment requests"
    )
    if alone and ramp:
        print(f"   ratio of medians ramp / alone: {np.median(ramp) / np.median(alone):.2f}")


def faster_15(runs: int, seed: int) -> None:
    reached = cut = 0
    to_final = []
    for i in range(runs):
        run = simulate(np.random.default_rng(seed + i), faster(1.5), policy=POLICY)
        final = [m for m, d in enumerate(run.decisions) if d.step == len(POLICY.schedule) - 1]
        reached += bool(final)
        cut += run.cut
        if final:
            to_final.append(final[0] + 1)
    print(
        f"2. 1.5x faster: reached the final step ({POLICY.schedule[-1]:g}) in {reached}/{runs}"
        f" runs, after {_quartiles(to_final)} minutes; cut in {cut}/{runs}"
    )


def aa(runs: int, seed: int, minutes: int) -> None:
    cuts: list[str] = []
    for run in _ramps(faster(1.0), runs, seed, minutes):
        if run.cut:
            cuts.append(run.decisions[-1].why)
    print(
        f"3. A/A, {minutes} minutes a run (most of it at the final step): cut in"
        f" {len(cuts)}/{runs} runs (allowed <= alpha = {ALPHA:g}: {ALPHA * runs:.0f})"
        + "".join(f"\n   {why}" for why in cuts)
    )


def drift(runs: int, seed: int) -> None:
    pooled_ratio, within_ratio = [], []
    pooled_slower = within_failed = 0
    for i in range(runs):
        rng = np.random.default_rng(seed + i)
        vals: dict[str, list[np.ndarray]] = {"c": [], "t": []}
        mins: dict[str, list[np.ndarray]] = {"c": [], "t": []}
        guard = StepGuard(
            alpha=ALPHA, tolerance=TOLERANCE, steps=len(POLICY.schedule), revise_s=DEFAULT_HORIZON_S
        )
        failed = False
        for k, share in enumerate(POLICY.schedule):
            step: dict[str, list[np.ndarray]] = {"c": [], "t": []}
            step_mins: dict[str, list[np.ndarray]] = {"c": [], "t": []}
            for m in range(25 * k, 25 * k + 25):
                n_t = int(rng.binomial(RATE, share))
                for arm, n in (("c", RATE - n_t), ("t", n_t)):
                    v = control_sampler(rng, n, drifting_load(m))
                    for d, dm in ((vals, mins), (step, step_mins)):
                        d[arm].append(v)
                        dm[arm].append(np.full(n, m))
            c, t = (
                ArmSample.from_values(
                    np.concatenate(step[a]), np.concatenate(step_mins[a]) - 25 * k, 25
                )
                for a in ("c", "t")
            )
            if k == len(POLICY.schedule) - 1:
                within_ratio.append(t.quantile(0.5) / c.quantile(0.5))
            guard.begin(since=60.0 * 25 * k, basis=k + 1)
            c_rows, t_rows = (
                StepRows.of(np.concatenate(step_mins[a]) - 25 * k, np.concatenate(step[a]))
                for a in ("c", "t")
            )
            end = 60.0 * 25 * (k + 1)
            guard.fold(c_rows, t_rows, until=end)
            seq = guard.look(at=end).seq
            failed |= seq is not None and (seq["p99_slower"] or seq["median_slower"])
        within_failed += failed
        c, t = (
            ArmSample.from_values(np.concatenate(vals[a]), np.concatenate(mins[a]), 100)
            for a in ("c", "t")
        )
        pooled_ratio.append(t.quantile(0.5) / c.quantile(0.5))
        pooled_slower += (
            evidence(c, t, alpha=ALPHA, tolerance=TOLERANCE).verdicts.verdict == "slower"
        )
    print(
        "4. load doubling while an A/A treatment ramps 1% -> 5% -> 25% -> 50% (25 min a step):\n"
        f"   pooled over the ramp (naive): median ratio {np.mean(pooled_ratio):.3f}"
        f" (sd {np.std(pooled_ratio):.3f}), the E2E verdict 'slower' in"
        f" {pooled_slower}/{runs} runs\n"
        f"   within the last step (one share): median ratio {np.mean(within_ratio):.3f}"
        f" (sd {np.std(within_ratio):.3f}); the step guard failed in {within_failed}/{runs} runs"
        " over all four steps"
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--aa-minutes", type=int, default=240)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", choices=("worse", "faster", "aa", "drift"))
    args = parser.parse_args(argv)
    parts: dict[str, Callable[[], None]] = {
        "worse": lambda: worse_p99(args.runs, args.seed + 20_000),
        "faster": lambda: faster_15(args.runs, args.seed + 30_000),
        "aa": lambda: aa(args.runs, args.seed + 40_000, args.aa_minutes),
        "drift": lambda: drift(args.runs, args.seed + 50_000),
    }
    for name, part in parts.items():
        if args.only in (None, name):
            part()


if __name__ == "__main__":
    main()
