"""The block-length rule: Politis-White grows with dependence, blocks are capped, units fit."""

from __future__ import annotations

import math

import numpy as np
import scipy.signal

from specproxy.stats.estimate.blocklength import (
    COVERAGE_FACTOR,
    MIN_BLOCKS,
    plan_blocks,
    politis_white_block_length,
)


def _ar1(phi: float, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.asarray(scipy.signal.lfilter([1.0], [1.0, -phi], rng.normal(size=n)))


def test_politis_white_grows_with_dependence() -> None:
    iid = np.median([politis_white_block_length(_ar1(0.0, 2000, s)) for s in range(5)])
    weak = np.median([politis_white_block_length(_ar1(0.5, 2000, s)) for s in range(5)])
    strong = np.median([politis_white_block_length(_ar1(0.9, 2000, s)) for s in range(5)])
    assert iid < 4.0 < weak < strong
    # asymptotic b_CB for AR(1): (2 G^2 / D)^(1/3) n^(1/3) with G = 2 phi / (1 - phi)^2 and
    # g0 = (1 + phi) / (1 - phi) (both in units of the innovation variance / (1 - phi^2))
    phi, n = 0.9, 2000
    g = 2 * phi / (1 - phi) ** 2
    g0 = (1 + phi) / (1 - phi)
    theory = (2 * g**2 / (4 / 3 * g0**2)) ** (1 / 3) * n ** (1 / 3)
    assert 0.5 * theory < strong < 1.5 * theory


def test_constant_or_tiny_series_need_no_blocks() -> None:
    assert politis_white_block_length(np.ones(100)) == 1.0
    assert politis_white_block_length(np.array([1.0, 2.0])) == 1.0
    assert politis_white_block_length(np.array([np.nan] * 50)) == 1.0


def test_plan_doubles_politis_white_and_keeps_min_blocks() -> None:
    series = _ar1(0.9, 400, 1)
    plan = plan_blocks([series, _ar1(0.0, 400, 2)], 400)
    b_pw = politis_white_block_length(series)
    assert plan.politis_white == b_pw  # the larger of the two arms
    assert plan.block_units == min(math.ceil(COVERAGE_FACTOR * b_pw), 400 // MIN_BLOCKS)
    assert plan.blocks == math.ceil(400 / plan.block_units) and plan.reliable
    short = plan_blocks([series[:30]], 30)
    assert short.block_units == 1 and short.blocks == 30 and short.reliable
    tiny = plan_blocks([series[:10]], 10)
    assert not tiny.reliable
