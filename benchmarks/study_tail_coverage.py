"""Coverage of the time-block speedup intervals (`blockboot`) when latency is serially correlated,
and when the tail is correlated more than the body: the study behind the block length read off
each statistic's influence series and the small-sample expansion of the block intervals.

Each run draws two arms of Poisson arrivals (10 per second per arm) over T seconds; a request's
log latency is N(0, 0.5^2) noise plus the arm's own dependence (independent between the arms):

  iid       nothing;
  ar1       a level per time unit (the analysis unit, `row_unit(T)`: 1 s at T = 90 s, 5 s at
            T = 1000 s), AR(1) from unit to unit with rho 0.3 and stationary sd 0.3;
  ou        an Ornstein-Uhlenbeck drift, stationary sd 0.3, time constant 0.5 s (exact AR(1) on a
            5 ms grid, read at each request's start);
  tail      slow periods of 4 s starting at rate 1/15 s (Poisson), in which each request stalls
            with probability 0.15 (x e^1.2): about 4 % of requests, the top few percent;
  taillong  slow periods of 30 s at rate 1/100 s stalling 4 % of their requests (x e^2): about
            1 % of requests, in a few long clusters the mean log series hardly shows.

The speculative arm is the baseline divided by 1.25 in law, so every ratio of quantiles and the
ratio of means equals 1.25 exactly: that is the truth each interval is checked against.

A run goes through the production path: the arms become `ArmSample.from_values` as a row window
does (`stats.job.rows`: unit = `row_unit(span)`, from a minute boundary), and
`block_speedup_intervals` gives the point estimates and the intervals (the i.i.d. one from the
histograms where production reports it, below 20 blocks). Rules:

  today      the rule before this study: B = clip(ceil(2 b_PW), 1, M // 20) with b_PW of the
             per-unit mean log latency only, the plain percentile interval (block_units and
             expand=False passed explicitly);
  expand     today's B, with the small-sample expansion (ablation);
  influence  the block length of `block_speedup_intervals` (b_PW the largest over the mean log
             series and every statistic's influence series), no expansion (ablation);
  new        `block_speedup_intervals` as it is now: that block length and the expansion;
  new10      as new, but with at least 10 blocks instead of 20, i.e. B up to M // 10 (the block
             interval read directly: production reports the i.i.d. one below 20 blocks).

Printed per size, truth, rule and statistic: coverage of the nominal 95 % interval with its
Monte-Carlo SE sqrt(c (1 - c) / runs), the median log-width log(upper / lower), the sd of
z = log(estimate / truth) / (log-width / (2 x 1.96)), the median block length B (units) and
number of blocks, and the expansion factor's median and 95th percentile; then the quartiles of
the Politis-White length of each series (the larger arm's), which shows what the mean log series
misses. All rules see the same data in a run; the bootstrap draws are seeded per (seed, size,
truth, run, rule), so a cell's figures do not depend on which other cells are run.

Run (CPU-bound, one process; 1000 runs, the default, take 1-2 CPU-minutes per size x truth):
  PYTHONPATH=src .venv/bin/python benchmarks/study_tail_coverage.py --runs 1000 --seed 1 --sizes 90
  PYTHONPATH=src .venv/bin/python benchmarks/study_tail_coverage.py --seed 1 --sizes 1000
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final

import numpy as np
import numpy.typing as npt
import scipy.signal

from specproxy.stats.estimate.blockboot import BlockInterval, block_speedup_intervals
from specproxy.stats.estimate.blocklength import plan_blocks, politis_white_block_length
from specproxy.stats.estimate.bootstrap import Interval
from specproxy.stats.job.rows import row_unit
from specproxy.stats.sample import ArmSample

FloatArray = npt.NDArray[np.float64]

SPEEDUP: Final = 1.25
RATE: Final = 10.0  # requests per second per arm
SIGMA: Final = 0.5  # per-request log-latency noise
STATISTICS: Final = ("median", "mean", "p90", "p99")
TRUTHS: Final = ("iid", "ar1", "ou", "tail", "taillong")
RULES: Final = ("today", "expand", "influence", "new", "new10")
Z975: Final = 1.959963984540054


def _ar1_path(rng: np.random.Generator, steps: int, rho: float, sd: float) -> FloatArray:
    """A stationary AR(1) path with marginal sd `sd`."""
    eps = rng.normal(0.0, sd * math.sqrt(1.0 - rho**2), steps)
    eps[0] = rng.normal(0.0, sd)
    return np.asarray(scipy.signal.lfilter([1.0], [1.0, -rho], eps), dtype=np.float64)


def _slow_periods(
    rng: np.random.Generator,
    t: FloatArray,
    span: float,
    *,
    rate: float,
    length: float,
    stall_p: float,
    stall_log: float,
) -> FloatArray:
    """Log-latency added by stalls: periods of `length` s start at `rate` per s (also before 0,
    so the process is stationary); inside one a request stalls with probability `stall_p`."""
    starts = np.sort(rng.uniform(-length, span, rng.poisson(rate * (span + length))))
    inside = np.searchsorted(starts, t, side="right") > np.searchsorted(
        starts, t - length, side="right"
    )
    stalled = inside & (rng.uniform(size=t.size) < stall_p)
    return np.where(stalled, stall_log, 0.0)


def _dependence(rng: np.random.Generator, truth: str, t: FloatArray, span: float) -> FloatArray:
    if truth == "iid":
        return np.zeros(t.size)
    if truth == "ar1":
        unit = row_unit(span)
        level = _ar1_path(rng, int(span // unit) + 1, 0.3, 0.3)
        out: FloatArray = level[np.floor(t / unit).astype(np.int64)]
        return out
    if truth == "ou":
        dt, tau = 0.005, 0.5
        path = _ar1_path(rng, int(span / dt) + 2, math.exp(-dt / tau), 0.3)
        drift: FloatArray = path[np.floor(t / dt).astype(np.int64)]
        return drift
    if truth == "tail":
        return _slow_periods(rng, t, span, rate=1 / 15, length=4.0, stall_p=0.15, stall_log=1.2)
    if truth == "taillong":
        return _slow_periods(rng, t, span, rate=1 / 100, length=30.0, stall_p=0.04, stall_log=2.0)
    raise ValueError(f"unknown truth {truth!r}")


def draw_arm(
    rng: np.random.Generator, truth: str, span: float, scale: float
) -> tuple[FloatArray, FloatArray]:
    """(start times, latencies) of one arm: Poisson arrivals, latency / `scale` in law."""
    t = np.sort(rng.uniform(0.0, span, rng.poisson(RATE * span)))
    log = rng.normal(0.0, SIGMA, t.size) + _dependence(rng, truth, t, span)
    return t, np.exp(log) / scale


def time_blocks(
    times: tuple[FloatArray, FloatArray], values: tuple[FloatArray, FloatArray]
) -> tuple[ArmSample, ArmSample]:
    """Both arms' samples, as a row window builds them (units from a minute boundary)."""
    b_t, s_t = times
    first = float(min(b_t.min(), s_t.min()))
    last = float(max(b_t.max(), s_t.max()))
    unit = row_unit(last - first)
    t0 = math.floor(first / 60.0) * 60.0
    units = int((last - t0) // unit) + 1
    b, s = (
        ArmSample.from_values(v, np.floor((t - t0) / unit).astype(np.int64), units, unit)
        for t, v in zip(times, values, strict=True)
    )
    return b, s


def _blocks_at_least(arms: tuple[ArmSample, ArmSample], min_blocks: int) -> int:
    """B of `block_speedup_intervals`' series (mean log and each statistic's influence), with the
    cap at `min_blocks` blocks instead of 20."""
    series = [a.unit_log_means() for a in arms]
    series += [a.unit_influence(stat) for stat in STATISTICS for a in arms]
    units = arms[0].units
    b_pw = plan_blocks(series, units).politis_white
    return int(min(max(math.ceil(2.0 * b_pw), 1), max(1, units // min_blocks)))


@dataclass
class Tally:
    """Per statistic: hits, log-widths and z of the runs so far, and the rule's B and expansion."""

    hits: dict[str, int] = field(default_factory=lambda: dict.fromkeys(STATISTICS, 0))
    widths: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STATISTICS})
    z: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STATISTICS})
    expansion: dict[str, list[float]] = field(default_factory=lambda: {s: [] for s in STATISTICS})
    block_units: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)

    def add(self, stat: str, interval: Interval, expansion: float) -> None:
        lo, hi, est = interval.lower, interval.upper, interval.estimate
        self.hits[stat] += int(lo <= SPEEDUP <= hi)
        width = math.log(hi / lo) if lo > 0 and hi > 0 else math.nan
        self.widths[stat].append(width)
        self.z[stat].append(math.log(est / SPEEDUP) / (width / (2 * Z975)))
        self.expansion[stat].append(expansion)


def _run_rule(
    rule: str,
    arms: tuple[ArmSample, ArmSample],
    rng: np.random.Generator,
    resamples: int,
) -> tuple[dict[str, tuple[Interval, float]], int, int]:
    """Per statistic (the interval the rule reports, its expansion), B and blocks."""
    b, s = arms
    if rule in ("today", "expand"):
        block_units: int | None = plan_blocks(
            [b.unit_log_means(), s.unit_log_means()], b.units
        ).block_units
    elif rule == "new10":
        block_units = _blocks_at_least(arms, 10)
    else:
        block_units = None
    res = block_speedup_intervals(
        b,
        s,
        statistics=list(STATISTICS),
        rng=rng,
        resamples=resamples,
        block_units=block_units,
        expand=rule in ("expand", "new", "new10"),
    )
    out: dict[str, tuple[Interval, float]] = {}
    for stat in STATISTICS:
        chosen: BlockInterval = res.intervals[stat]
        if rule == "new10" or chosen.reported == "block":
            out[stat] = (chosen.block, chosen.expansion)
        else:  # the i.i.d. interval production reports (below 20 blocks)
            out[stat] = (chosen.iid, 1.0)
    return out, res.plan.block_units, res.plan.blocks


def simulate(
    span: float, truth: str, rules: Sequence[str], runs: int, seed: int, resamples: int
) -> tuple[dict[str, Tally], dict[str, list[float]]]:
    """Per rule its tally, and per series ("mean log" and each statistic's influence) the
    Politis-White length of each run (the larger of the two arms')."""
    tallies = {rule: Tally() for rule in rules}
    b_pw: dict[str, list[float]] = {name: [] for name in ("mean log", *STATISTICS)}
    truth_id = TRUTHS.index(truth)
    for run in range(runs):
        data_rng = np.random.default_rng([seed, int(span), truth_id, run])
        b_t, b_v = draw_arm(data_rng, truth, span, 1.0)
        s_t, s_v = draw_arm(data_rng, truth, span, SPEEDUP)
        arms = time_blocks((b_t, s_t), (b_v, s_v))
        b_pw["mean log"].append(max(politis_white_block_length(a.unit_log_means()) for a in arms))
        for stat in STATISTICS:
            b_pw[stat].append(max(politis_white_block_length(a.unit_influence(stat)) for a in arms))
        for rule in rules:
            rng = np.random.default_rng([seed, int(span), truth_id, run, RULES.index(rule)])
            intervals, block_units, blocks = _run_rule(rule, arms, rng, resamples)
            tally = tallies[rule]
            tally.block_units.append(block_units)
            tally.blocks.append(blocks)
            for stat, (interval, expansion) in intervals.items():
                tally.add(stat, interval, expansion)
    return tallies, b_pw


def _print(
    span: float,
    truth: str,
    runs: int,
    tallies: dict[str, Tally],
    b_pw: dict[str, list[float]],
    cpu: float,
) -> None:
    print(
        f"\nT = {span:g} s (~{RATE * span:.0f} per arm), truth {truth}, {runs} runs "
        f"({cpu:.0f} CPU-s); cells: coverage +- MC SE / median log-width / sd z; last: "
        "the expansion factor per statistic, median/95th percentile"
    )
    print(f"  {'rule':9s} {'B':>3s} {'blk':>4s} " + "".join(f"{s:>27s}" for s in STATISTICS))
    for rule, t in tallies.items():
        cells = []
        for stat in STATISTICS:
            c = t.hits[stat] / runs
            se = math.sqrt(c * (1 - c) / runs)
            w = float(np.nanmedian(t.widths[stat]))
            sz = float(np.nanstd(t.z[stat]))
            cells.append(f"{c:.3f}+-{se:.3f}/{w:.3f}/{sz:.2f}")
        expansions = " ".join(
            f"{float(np.median(t.expansion[s])):.2f}/{float(np.percentile(t.expansion[s], 95)):.2f}"
            for s in STATISTICS
        )
        print(
            f"  {rule:9s} {float(np.median(t.block_units)):3.0f} {float(np.median(t.blocks)):4.0f} "
            + "".join(f"{c:>27s}" for c in cells)
            + f"   {expansions}"
        )
    quartiles = "; ".join(
        f"{name} " + "/".join(f"{q:.1f}" for q in np.percentile(values, [25, 50, 75]))
        for name, values in b_pw.items()
    )
    print(f"  Politis-White length (units) quartiles, by series: {quartiles}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--resamples", type=int, default=2000, help="as stats.resamples")
    parser.add_argument(
        "--sizes", default="90,1000", help="run lengths in seconds, comma-separated"
    )
    parser.add_argument("--truths", default=",".join(TRUTHS))
    parser.add_argument("--rules", default=",".join(RULES))
    args = parser.parse_args()
    truths = [t for t in args.truths.split(",") if t]
    rules = [r for r in args.rules.split(",") if r]
    for name, given, known in (("truth", truths, TRUTHS), ("rule", rules, RULES)):
        unknown = sorted(set(given) - set(known))
        if unknown:
            parser.error(f"unknown {name}(s) {unknown}; choose from {list(known)}")
    for span in (float(x) for x in args.sizes.split(",") if x):
        for truth in truths:
            start = time.process_time()
            tallies, b_pw = simulate(span, truth, rules, args.runs, args.seed, args.resamples)
            _print(span, truth, args.runs, tallies, b_pw, time.process_time() - start)


if __name__ == "__main__":
    main()
