"""The metric verdict (`stats.verdict`): both P99 tests per direction at alpha / 2, the median
test, combined by `sequential.decide`; raw values and histograms."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.loggrid import bin_centres, bin_index, bin_lower_edges
from specproxy.stats.p99test import BinnedArm, p99_slower_test
from specproxy.stats.sequential import RankedArm, compare_sequential, decide
from specproxy.stats.verdict import anytime_valid, anytime_valid_binned

FloatArray = npt.NDArray[np.float64]
ALPHA = 0.05


def _hist(values: FloatArray) -> tuple[RankedArm, BinnedArm]:
    bins, counts = np.unique(bin_index(values), return_counts=True)
    return (
        RankedArm.of_histogram(bin_centres(bins), counts),
        BinnedArm(bin_lower_edges(bins), bin_lower_edges(bins + 1), counts.astype(np.int64)),
    )


def test_each_test_runs_at_half_alpha_and_the_block_reports_it() -> None:
    rng = np.random.default_rng(1)
    b, s = rng.lognormal(0.0, 0.5, 3000), rng.lognormal(0.0, 0.5, 3000)
    seq = anytime_valid(b, s, alpha=ALPHA, tolerance=0.05)
    p99 = seq["p99"]
    assert p99["level"] == ALPHA / 2
    assert p99["slower"]["boundary"] == pytest.approx(math.log(2 / ALPHA))
    direct = p99_slower_test(b, s, alpha=ALPHA / 2, tolerance=0.05)
    assert p99["slower"]["statistic"] == pytest.approx(direct.statistic)
    swapped = p99_slower_test(s, b, alpha=ALPHA / 2, tolerance=0.05)
    assert p99["faster"]["statistic"] == pytest.approx(swapped.statistic)
    # the P99 ratio CS is the union bound at alpha / 2, the median's at alpha
    half = compare_sequential(b, s, alpha=ALPHA / 2, tolerance=0.05)
    full = compare_sequential(b, s, alpha=ALPHA, tolerance=0.05)
    assert seq["p99_ratio_lower"] == pytest.approx(half.p99_ratio_lower)
    assert seq["median_ratio_lower"] == pytest.approx(full.median_ratio_lower)
    assert seq["verdict"] == "inconclusive" and seq["decided_by"] == [] and not p99["binned"]


def test_clear_slowdown_is_decided_by_both_p99_tests() -> None:
    rng = np.random.default_rng(2)
    b, s = rng.lognormal(0.0, 0.5, 5000), 1.6 * rng.lognormal(0.0, 0.5, 5000)
    seq = anytime_valid(b, s, alpha=ALPHA, tolerance=0.05)
    assert seq["verdict"] == "slower" and seq["p99_slower"]
    assert seq["p99"]["verdict"] == "slower"
    assert seq["p99"]["decided_by"] == ["union_bound", "two_sample"]
    assert seq["decided_by"] == ["p99_union_bound", "p99_two_sample", "median"]


def test_the_two_sample_test_decides_where_the_union_bound_cannot() -> None:
    """+10 % on P99 at sigma 0.5 and 20k per arm: the product e-process rejects, the per-arm
    union bound does not (power 0.94 vs 0.72 in tests/stats/test_p99test.py)."""
    rng = np.random.default_rng(3)
    for _ in range(20):  # the first seeded draw where the two disagree (most draws)
        b, s = rng.lognormal(0.0, 0.5, 20_000), 1.1 * rng.lognormal(0.0, 0.5, 20_000)
        seq = anytime_valid(b, s, alpha=ALPHA, tolerance=0.0)
        if seq["p99"]["decided_by"] == ["two_sample"]:
            break
    assert seq["p99"]["verdict"] == "slower" and seq["verdict"] == "slower"
    assert not seq["p99"]["union_bound_slower"] and seq["p99"]["slower"]["rejected"]
    statistic = seq["p99"]["slower"]["statistic"]
    assert statistic is not None and statistic >= seq["p99"]["slower"]["boundary"]
    assert "p99_two_sample" in seq["decided_by"]


def test_faster_p99_beyond_the_tolerance_gives_a_faster_p99_verdict() -> None:
    rng = np.random.default_rng(4)
    b = rng.lognormal(0.0, 0.5, 5000)
    # same median, a much shorter tail on the speculative arm
    s = np.exp(0.5 * rng.standard_normal(5000).clip(-4.0, 1.2))
    seq = anytime_valid(b, s, alpha=ALPHA, tolerance=0.05)
    assert seq["p99"]["verdict"] == "faster" and not seq["p99_slower"]
    assert "two_sample" in seq["p99"]["decided_by"] and seq["p99"]["faster"]["rejected"]
    assert seq["verdict"] == "faster"


def test_histograms_give_the_same_verdicts_on_clear_cases_and_say_they_are_binned() -> None:
    rng = np.random.default_rng(5)
    b = rng.lognormal(0.0, 0.5, 5000)
    for factor, verdict in ((1.6, "slower"), (1 / 1.6, "faster"), (1.0, "inconclusive")):
        s = factor * rng.lognormal(0.0, 0.5, 5000)
        exact = anytime_valid(b, s, alpha=ALPHA, tolerance=0.05)
        (rb, hb), (rs, hs) = _hist(b), _hist(s)
        binned = anytime_valid_binned((rb, rs), (hb, hs), alpha=ALPHA, tolerance=0.05)
        assert exact["p99"]["verdict"] == binned["p99"]["verdict"] == verdict
        assert binned["p99"]["binned"]
        for side in ("slower", "faster"):
            e, h = exact["p99"][side]["statistic"], binned["p99"][side]["statistic"]
            assert e is not None and h is not None and h <= e + 1e-12


@pytest.mark.parametrize(
    ("bounds", "two_sample", "p99", "verdict", "decided_by"),
    [
        ((0.9, 1.2, 0.95, 1.05), (False, False), "inconclusive", "inconclusive", []),
        ((1.10, 1.3, 0.95, 1.05), (False, False), "slower", "slower", ["p99_union_bound"]),
        ((0.9, 1.2, 0.95, 1.05), (True, False), "slower", "slower", ["p99_two_sample"]),
        (
            (0.8, 0.94, 0.95, 1.05),
            (False, True),
            "faster",
            "faster",
            ["p99_union_bound", "p99_two_sample"],
        ),
        # a slower tail is never outweighed by a faster median
        ((0.9, 1.2, 0.80, 0.90), (True, False), "slower", "slower", ["p99_two_sample"]),
        ((0.9, 1.2, 0.80, 0.90), (False, False), "inconclusive", "faster", ["median"]),
        ((0.9, 1.2, 1.02, 1.10), (False, True), "faster", "slower", ["median"]),
        # evidence both ways on P99: neither claim
        ((1.10, 1.3, 0.95, 1.05), (False, True), "inconclusive", "inconclusive", []),
        # both the median and P99 faster
        ((0.8, 0.9, 0.80, 0.90), (True, True), "inconclusive", "faster", ["median"]),
    ],
)
def test_the_rule(
    bounds: tuple[float, float, float, float],
    two_sample: tuple[bool, bool],
    p99: str,
    verdict: str,
    decided_by: list[str],
) -> None:
    d = decide(
        *bounds, tolerance=0.05, two_sample_slower=two_sample[0], two_sample_faster=two_sample[1]
    )
    assert (d.p99_verdict, d.verdict, d.decided_by) == (p99, verdict, decided_by)
