"""Samples per arm to detect a 5 % median change (`estimate.samplesize`), from histograms: the
kernel density of log latency at its median against the exact one (oracle) and theory."""

from __future__ import annotations

import math

import numpy as np
import numpy.typing as npt
import pytest

from specproxy.stats.estimate.samplesize import (
    density_at_median,
    samples_for_median_change,
    samples_from_densities,
)
from specproxy.stats.sample import ArmSample
from tests.stats import oracles

FloatArray = npt.NDArray[np.float64]


def one_unit(values: FloatArray) -> ArmSample:
    return ArmSample.from_values(values, np.zeros(values.size, dtype=np.int64), 1)


def test_density_of_log_normal_at_median_from_bins() -> None:
    x = np.random.default_rng(0).lognormal(0.0, 0.5, 20_000)
    got = density_at_median(one_unit(x))
    assert got == pytest.approx(1 / (0.5 * np.sqrt(2 * np.pi)), rel=0.05)
    # the same kernel and bandwidth as over the values, within the grid's half-bin shifts
    assert got == pytest.approx(oracles.log_density_at_median(x), rel=0.01)
    assert math.isnan(density_at_median(one_unit(x[:9])))
    assert density_at_median(one_unit(np.full(20, 0.3))) == math.inf


def test_sample_size_matches_the_closed_form() -> None:
    rng = np.random.default_rng(1)
    n = samples_for_median_change(
        one_unit(rng.lognormal(0, 0.5, 20_000)), one_unit(rng.lognormal(0, 0.5, 20_000))
    )
    # var of log-median = pi * sigma^2 / (2n) per arm; (1.96 + 0.84)^2 * 2 * that / log(1.05)^2
    expected = (1.959964 + 0.841621) ** 2 * 2 * np.pi * 0.25 / 2 / np.log(1.05) ** 2
    assert n == pytest.approx(expected, rel=0.1)
    assert samples_for_median_change(one_unit(np.ones(3)), one_unit(np.ones(3))) is None


def test_the_formula_from_densities() -> None:
    f = 1 / (0.5 * math.sqrt(2 * math.pi))
    z = 1.959963984540054 + 0.8416212335729143
    want = math.ceil(z**2 * 2 / (4 * f**2) / math.log1p(0.05) ** 2)
    assert samples_from_densities(f, f) == want
    wider = samples_from_densities(f, f, effect=0.1)
    assert wider is not None and wider < want
    for bad in (math.nan, math.inf, 0.0):
        assert samples_from_densities(bad, f) is None and samples_from_densities(f, bad) is None
