"""Speedups by condition: the bands from condition summaries, the bound on categories, too little
data, and coverage of known per-category speedups."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT
from specproxy.stats.job.frame import ConditionSamples, WindowPlan
from specproxy.stats.job.rows import Rows
from specproxy.stats.result import Conditions, CrossoverResult
from specproxy.stats.segments import (
    CATEGORIES_MAX,
    MIN_BAND_REQUESTS,
    band_keys,
    conditional,
    crossover_words,
)

Columns = dict[str, Any]


def sources(
    control: Columns, treatment: Columns, *, units: int, unit_s: float = 1.0
) -> tuple[ConditionSamples, ConditionSamples]:
    """Both arms' condition summaries over units 0..units-1, built from rows as the stats job
    builds them (keyed and binned as the store's writer does: `Rows.condition_tiers`). Each
    arm's columns hold `unit` (a request's time unit) and any record columns."""

    def arrays(columns: Columns) -> dict[str, Any]:
        unit = np.asarray(columns["unit"], dtype=np.float64)
        out: dict[str, Any] = {
            "t_start": (unit + 0.5) * unit_s,
            "shadow": np.zeros(unit.size, dtype=bool),
            "model": np.full(unit.size, "m", dtype=object),
        }
        out.update({k: v for k, v in columns.items() if k != "unit"})
        return out

    rows = Rows({SHORTHAND_CONTROL: arrays(control), SHORTHAND_TREATMENT: arrays(treatment)})
    tiers = rows.condition_tiers(unit_s)
    plan = WindowPlan(None, 0, units - 1, unit_s, hourly=False, coarse=False)
    return (
        ConditionSamples.of(tiers, plan, SHORTHAND_CONTROL, set()),
        ConditionSamples.of(tiers, plan, SHORTHAND_TREATMENT, set()),
    )


def conditions_of(
    control: Columns, treatment: Columns, *, units: int, seed: int = 1, resamples: int = 100
) -> Conditions:
    c, t = sources(control, treatment, units=units)
    return conditional(
        c,
        t,
        units=units,
        rng=np.random.default_rng(seed),
        resamples=resamples,
        confidence=0.95,
    )


def _columns(n: int, rng: np.random.Generator, *, units: int, **columns: Any) -> Columns:
    base: Columns = {
        "unit": rng.integers(0, units, n),
        "e2e_s": rng.lognormal(0.0, 0.3, n),
        "tpot_s": rng.lognormal(-4.0, 0.3, n),
    }
    base.update(columns)
    return base


def test_band_keys_gather_load_keys_into_bands_in_order() -> None:
    keys = ["load=1", "load=3", "load=2", "load=24", "load=40", "load=12", "prompt=<128"]
    got = band_keys("load", keys, {})
    assert got == [
        ("1", frozenset({"load=1"})),
        ("2-3", frozenset({"load=2", "load=3"})),
        ("8-15", frozenset({"load=12"})),
        ("16-31", frozenset({"load=24"})),
        ("32+", frozenset({"load=40"})),
    ]
    temps = band_keys("temperature", ["temperature=default", "temperature=0"], {})
    assert [b for b, _ in temps] == ["0", "default"]


def test_categories_beyond_the_bound_are_other_and_a_thin_band_shows_no_number() -> None:
    rng = np.random.default_rng(0)
    names = [f"c{i:02d}" for i in range(CATEGORIES_MAX + 4)]
    # the first CATEGORIES_MAX names hold more requests than the last four
    cats = np.array(
        [names[i % len(names)] for i in range(2000)] + names[:CATEGORIES_MAX] + [None] * 10,
        dtype=object,
    )
    control = _columns(cats.size, rng, units=50, category=cats)
    treatment = _columns(cats.size, rng, units=50, category=cats.copy())
    result = conditions_of(control, treatment, units=50)
    bands = {b["band"]: b for b in result["segments"]["category"]["tpot"]}
    assert set(bands) == {*names[:CATEGORIES_MAX], "other"}  # 16 names and "other"
    assert bands["other"]["n"]["control"] == 4 * 100  # the four rarest, 100 requests each
    # no header: in no category band
    assert sum(b["n"]["control"] for b in bands.values()) == cats.size - 10
    few = _columns(
        2 * MIN_BAND_REQUESTS, rng, units=50, temperature=np.r_[np.zeros(59), 0.7].astype(object)
    )
    thin_result = conditions_of(few, few, units=50)
    thin = {b["band"]: b for b in thin_result["segments"]["temperature"]["tpot"]}
    assert thin["(0.5,1]"]["status"] == "too_little_data"
    assert thin["(0.5,1]"]["speedup"] is None and thin["(0.5,1]"]["n"]["control"] == 1
    assert thin["0"]["status"] == "ok" and thin["0"]["speedup"] is not None
    assert thin_result["crossover"]["tpot"]["status"] == "too_little_data"  # no load recorded
    assert thin_result["summary"] is None


def test_a_band_s_speedup_is_its_requests_median_ratio() -> None:
    """The band holds exactly its requests: a treatment 2x faster at load 1 and 1.25x at load
    20, so the load-1 band says ~2 and the 16-31 band ~1.25."""
    rng = np.random.default_rng(3)
    n = 600
    load = np.repeat([1, 20], n // 2).astype(object)
    control = _columns(n, rng, units=60, endpoint_in_flight=load)
    tpot = np.asarray(control["tpot_s"], dtype=np.float64)
    treatment = dict(control, tpot_s=tpot / np.where(load == 1, 2.0, 1.25))
    result = conditions_of(control, treatment, units=60, resamples=200)
    bands = {b["band"]: b for b in result["segments"]["load"]["tpot"]}
    assert set(bands) == {"1", "16-31"}
    assert bands["1"]["speedup"] == pytest.approx(2.0, rel=0.01)  # the coarse grid: 0.5 %
    assert bands["16-31"]["speedup"] == pytest.approx(1.25, rel=0.01)
    assert bands["1"]["n"] == {"control": n // 2, "treatment": n // 2}
    # where each was measured: its requests' mean load, a key's middle above 7 (20-23 for 20)
    assert bands["1"]["load"] == 1.0 and bands["16-31"]["load"] == 21.5
    other = result["segments"]["temperature"]["tpot"]
    assert all("load" not in b for b in other)


def test_crossover_words() -> None:
    found: CrossoverResult = {
        "status": "ok",
        "load": 12.2,
        "lower": 9.4,
        "upper": 15.1,
        "confidence": 0.95,
        "observed": [1.0, 40.0],
        "speedup_below": 1.62,
        "speedup_above": 0.92,
        "groups": [],
        "block_units": 4,
    }
    assert crossover_words(found) == (
        "speculation helps below about 12 concurrent requests per engine [9, 15] (TPOT 1.62x),"
        " and costs 8% above"
    )
    found["status"], found["load"] = "helps_throughout", None
    assert crossover_words(found) == (
        "speculation helps (TPOT) at every load observed (1-40 concurrent requests per engine)"
    )


CATEGORY_SPEEDUPS = {"code": 2.0, "chat": 1.4, "math": 1.1}


def category_run(seed: int, per_category: int = 300, units: int = 60) -> tuple[Columns, Columns]:
    """Known truth: lognormal TPOTs (sd 0.4) with a per-unit level shared by the arms (sd 0.1),
    the treatment faster by `CATEGORY_SPEEDUPS` in law, so each category's ratio of medians is
    exactly its speedup."""
    rng = np.random.default_rng(seed)
    level = rng.normal(0.0, 0.1, units)
    arms = []
    for faster in (False, True):
        cats = np.repeat(np.array(list(CATEGORY_SPEEDUPS), dtype=object), per_category)
        unit = rng.integers(0, units, cats.size).astype(np.int64)
        scale = np.array([CATEGORY_SPEEDUPS[c] if faster else 1.0 for c in cats])
        tpot = np.exp(-4.0 + level[unit] + rng.normal(0.0, 0.4, cats.size)) / scale
        arms.append({"unit": unit, "tpot_s": tpot, "e2e_s": tpot * 100, "category": cats})
    return arms[0], arms[1]


def category_coverage(runs: int, *, resamples: int = 300) -> float:
    """The share of per-category intervals (TPOT median) that hold the category's speedup."""
    hits = total = 0
    for seed in range(runs):
        control, treatment = category_run(seed)
        result = conditions_of(control, treatment, units=60, seed=seed, resamples=resamples)
        for band in result["segments"]["category"]["tpot"]:
            truth = CATEGORY_SPEEDUPS[band["band"]]
            lo, hi = band["lower"], band["upper"]
            assert lo is not None and hi is not None
            hits += lo <= truth <= hi
            total += 1
    return hits / total


@pytest.mark.slow
def test_per_category_intervals_cover_their_known_speedups() -> None:
    """60 intervals at nominal 95 %: fewer than 51 hits (85 %) has probability < 1e-3 when the
    true coverage is 95 % (benchmarks/study_segments.py measures it: 93-97 %)."""
    assert category_coverage(20) >= 51 / 60
