"""False alarms and power of the wired P99 verdict (`anytime.verdict.evidence`, kept over a
whole run by `anytime.decision.DecisionMemory`).

Prints figures; asserts nothing (the asserted versions are the slow tests of
tests/stats/anytime/test_verdict.py and test_exceedance.py, which share these draws).

1. A/A: both arms lognormal(0, 0.5), noise i.i.d., AR(1) rho 0.3 on log latency, or sinusoidal
   load waves scaling both arms; a look every 100 samples per arm up to 3000; the whole-run
   verdict of a paired design (the values given as pairs) as the job keeps it (DecisionMemory).
   Counted: runs that ever said "slower" or "faster", and which test said it, at tolerance 0.05
   (the default) and 0 (P99 at the null's boundary, where false P99 alarms are likeliest).
2. Power for a +10 % P99 at sigma 0.5, tolerance 0, at 5k/10k/20k per arm:
   * "scale": speculative = 1.1 x baseline in law (median and P99 both +10 %);
   * "tail": only the upper half is stretched, log s = z sigma (1 + k 1{z > 0}) with
     k = ln 1.1 / (2.326 sigma), so P99 is +10 % and the median is unchanged;
   one look at n (what `specproxy stats` says once), and the whole-run verdict with a look
   every 1000 per arm (what the running job says by n). Columns: the union bound alone at
   alpha (the verdict before the two-sample test), its half at alpha/2, the two-sample test at
   alpha/2 (on the pairs' exact values), the P99 verdict (either), and the metric verdict (P99
   or median). The confidence sequences read the arms' samples (fine-grid histograms) as in a
   window's comparison; the two-sample test no longer runs on histograms.

3. The per-minute exceedance test (`stats.exceedance`, each direction at alpha/2 as wired) on
   minute-structured traffic (tests/stats/test_exceedance.minute_arms: 200 requests a minute,
   the arm a coin flip within the minute; "ar1"/"waves": per-minute AR(1) noise rho 0.3 sd 0.5
   shared by both arms, plus a sinusoidal load wave, and a split that drifts 0.5 +- 0.25 from
   minute to minute). A/A to 5000/arm, tolerance 0: runs where a test said slower or faster --
   the exceedance test over every minute (its running maximum), the i.i.d. tests and both
   verdicts at the LAST look only (a lower bound of what looking often gives). Power for +10 %
   (in law) at sigma 0.5: exceedance by n (every minute), the others at one look at n; the
   wired split verdict (union bound + exceedance) against the i.i.d. one (union bound +
   two-sample, what mirrored pairs get), all tests at alpha/2.

Run: flock /tmp/heavy.lock .venv/bin/python benchmarks/bench_p99power.py [--aa-runs 500]
     [--power-runs 200] [--seed 1] [--only exceedance]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

from specproxy.stats.anytime.sequential import ratio_bounds

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # for tests.stats.anytime.test_verdict

from tests.stats.anytime.test_exceedance import claims, first_n, minute_arms
from tests.stats.anytime.test_verdict import (
    AA_N,
    ALPHA,
    LOOK_EVERY,
    POWER_SIZES,
    SIGMA,
    draw_arms,
    one_unit,
    paired,
    whole_run_verdicts,
)

Z99 = 2.3263478740408408
COLUMNS = ("union@a", "union@a/2", "2-sample@a/2", "P99 verdict", "metric verdict")


def _tail_stretched(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    k = math.log(1.1) / (Z99 * SIGMA)
    z_b, z_s = rng.standard_normal(n), rng.standard_normal(n)
    return np.exp(SIGMA * z_b), np.exp(SIGMA * z_s * (1.0 + k * (z_s > 0)))


def aa(runs: int, seed: int) -> None:
    print(f"A/A: {runs} runs, a look every {LOOK_EVERY} to {AA_N}/arm, alpha {ALPHA}")
    for tolerance in (0.05, 0.0):
        for setting in ("iid", "ar1", "waves"):
            rng = np.random.default_rng(seed)
            seen: Counter[str] = Counter()
            started = time.process_time()
            for _ in range(runs):
                base, spec = draw_arms(rng, setting, AA_N)
                looks = whole_run_verdicts(
                    base, spec, every=LOOK_EVERY, alpha=ALPHA, tolerance=tolerance
                )
                verdicts = {s["verdict"] for s in looks} - {"inconclusive"}
                seen.update(verdicts)
                seen["any"] += bool(verdicts)
                seen.update({t for s in looks for t in s.get("decided_by", [])})
            cpu = time.process_time() - started
            tests = ", ".join(f"{t} {seen[t]}" for t in ("p99_union_bound", "p99_two_sample"))
            print(
                f"  tol {tolerance:.2f} {setting:5}: slower {seen['slower']}, faster"
                f" {seen['faster']}, either {seen['any']} ({seen['any'] / runs:.3f});"
                f" by test: {tests}, median {seen['median']}  [{cpu:.0f} CPU-s]"
            )


def _row(base: np.ndarray, spec: np.ndarray) -> dict[str, bool]:
    v = paired(base, spec, 0.0).verdicts
    lower, _upper = ratio_bounds(one_unit(base), one_unit(spec), 0.99, ALPHA)
    return {
        "union@a": lower > 1.0,
        "union@a/2": v.p99_union_slower,
        "2-sample@a/2": v.e_slower,
        "P99 verdict": v.p99 == "slower",
        "metric verdict": v.verdict == "slower",
    }


def power(runs: int, seed: int) -> None:
    print(f"\nPower, +10% P99, sigma {SIGMA}, tolerance 0, alpha {ALPHA}, {runs} runs")
    for shape in ("scale", "tail"):
        rng = np.random.default_rng(seed)
        once = {n: Counter[str]() for n in POWER_SIZES}
        ever = {n: 0 for n in POWER_SIZES}
        started = time.process_time()
        for _ in range(runs):
            if shape == "scale":
                base, spec = draw_arms(rng, "iid", POWER_SIZES[-1], math.log(1.1))
            else:
                base, spec = _tail_stretched(rng, POWER_SIZES[-1])
            for n in POWER_SIZES:
                once[n].update(k for k, v in _row(base[:n], spec[:n]).items() if v)
            looks = whole_run_verdicts(base, spec, every=1000, alpha=ALPHA, tolerance=0.0)
            for n in POWER_SIZES:
                last = looks[n // 1000 - 1]
                ever[n] += last["p99"]["verdict"] == "slower"
        cpu = time.process_time() - started
        print(f"  {shape} ({cpu:.0f} CPU-s)")
        for n in POWER_SIZES:
            cells = ", ".join(f"{k} {once[n][k] / runs:.3f}" for k in COLUMNS)
            print(
                f"    n={n:>6}/arm one look: {cells}; whole run, look every 1000:"
                f" P99 verdict {ever[n] / runs:.3f}"
            )


def fixed_sample_power() -> None:
    """The reference the issue quotes: a one-sided normal test of log P99(spec) - log P99(base)
    at one fixed n (not anytime-valid), SE of a log quantile sqrt(p(1-p)/n) sigma / phi(z_p)."""
    p = 0.99
    phi = math.exp(-Z99 * Z99 / 2) / math.sqrt(2 * math.pi)
    z_alpha = 1.6448536269514722  # one-sided 5 %
    cells = []
    for n in POWER_SIZES:
        se = math.sqrt(2.0) * math.sqrt(p * (1 - p) / n) * SIGMA / phi
        z = math.log(1.1) / se - z_alpha
        cells.append(f"n={n}: {0.5 * math.erfc(-z / math.sqrt(2)):.2f}")
    print("  fixed-sample one-sided normal test at one look (reference): " + ", ".join(cells))


def exceedance(aa_runs: int, power_runs: int, seed: int) -> None:
    n_aa = 5000
    names = (
        "exceedance",
        "two-sample",
        "union",
        "verdict union+exceedance",
        "verdict union+two-sample",
    )
    for tolerance in (0.05, 0.0):
        print(
            f"\nMinute design, A/A to {n_aa}/arm, tolerance {tolerance}, {aa_runs} runs, each test"
            " at alpha/2: runs with a slower or faster claim (exceedance: over every minute;"
            " others: LAST look)"
        )
        for setting in ("iid", "ar1", "waves"):
            rng = np.random.default_rng(seed)
            seen: Counter[str] = Counter()
            started = time.process_time()
            for _ in range(aa_runs):
                base, spec = minute_arms(rng, setting, n_aa)
                seen.update(k for k, v in claims(base, spec, tolerance).items() if any(v))
            cpu = time.process_time() - started
            cells = ", ".join(f"{k} {seen[k]}/{aa_runs}" for k in names)
            print(f"  {setting:5}: {cells}  [{cpu:.0f} CPU-s]")
    print(
        f"\nMinute design, power for +10% P99 (in law), sigma {SIGMA}, tolerance 0,"
        f" {power_runs} runs, slower claims by n/arm (exceedance: any minute; others: one look)"
    )
    rng = np.random.default_rng(seed)
    hits = {n: Counter[str]() for n in POWER_SIZES}
    started = time.process_time()
    for _ in range(power_runs):
        base, spec = minute_arms(rng, "iid", POWER_SIZES[-1], math.log(1.1))
        for n in POWER_SIZES:
            b, s = first_n(base, spec, n)
            hits[n].update(k for k, v in claims(b, s).items() if v[0])
    cpu = time.process_time() - started
    for n in POWER_SIZES:
        cells = ", ".join(f"{k} {v / power_runs:.3f}" for k, v in sorted(hits[n].items()))
        print(f"  n<={n:>6}/arm: {cells}")
    print(f"  [{cpu:.0f} CPU-s]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa-runs", type=int, default=500)
    parser.add_argument("--power-runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", choices=("exceedance",), default=None)
    args = parser.parse_args()
    if args.only is None:
        aa(args.aa_runs, args.seed)
        power(args.power_runs, args.seed)
        fixed_sample_power()
    exceedance(args.aa_runs, args.power_runs, args.seed)


if __name__ == "__main__":
    main()
