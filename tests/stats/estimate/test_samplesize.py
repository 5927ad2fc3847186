from __future__ import annotations

import numpy as np
import pytest

from specproxy.stats.estimate.samplesize import log_density_at_median, samples_for_median_change


def test_density_of_log_normal_at_median() -> None:
    x = np.random.default_rng(0).lognormal(0.0, 0.5, 20_000)
    assert log_density_at_median(x) == pytest.approx(1 / (0.5 * np.sqrt(2 * np.pi)), rel=0.05)


def test_sample_size_matches_the_closed_form() -> None:
    rng = np.random.default_rng(1)
    n = samples_for_median_change(rng.lognormal(0, 0.5, 20_000), rng.lognormal(0, 0.5, 20_000))
    # var of log-median = pi * sigma^2 / (2n) per arm; (1.96 + 0.84)^2 * 2 * that / log(1.05)^2
    expected = (1.959964 + 0.841621) ** 2 * 2 * np.pi * 0.25 / 2 / np.log(1.05) ** 2
    assert n == pytest.approx(expected, rel=0.1)
    assert samples_for_median_change(np.ones(3), np.ones(3)) is None
