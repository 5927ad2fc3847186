"""`stats.compare.compare_window`: the design, the memory's verdicts in the headline, what is
unavailable, and interval notes that state only what was measured."""

from __future__ import annotations

import dataclasses

import numpy as np
import numpy.typing as npt

from specproxy.stats.anytime.decision import Decision, EProcess, Evidence
from specproxy.stats.compare import CompareSettings, compare_window, speedup_block
from specproxy.stats.diagnosis import EngineSummary
from specproxy.stats.estimate import blockboot
from specproxy.stats.estimate.blocklength import BlockPlan
from specproxy.stats.estimate.bootstrap import Interval
from specproxy.stats.sample import ArmSample, ArmWindow, Pairs

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
UNITS = 60
SETTINGS = CompareSettings(resamples=300)
ENGINE = {arm: EngineSummary() for arm in ("speculative", "baseline")}


def _window(
    e2e: FloatArray, unit: IntArray, *, moments: bool = False, ttft: FloatArray | None = None
) -> ArmWindow:
    samples = {
        "e2e": ArmSample.from_values(e2e, unit, UNITS, 1.0),
        "ttft": ArmSample.from_values(e2e / 5 if ttft is None else ttft, unit, UNITS, 1.0),
        "tpot": ArmSample.from_values(e2e / 50, unit, UNITS, 1.0),
    }
    m = None
    if moments:
        y = np.log(e2e)
        m = np.zeros((UNITS, 10))
        for u, v in zip(unit.tolist(), y.tolist(), strict=True):
            m[u] += [1, 0, 0, 0, 0, 0, v, 0, 0, v * v]
    return ArmWindow(samples, m)


def _arms(
    rng: np.random.Generator, n: int = 3000, speedup: float = 1.3, shared: float = 0.0
) -> tuple[ArmWindow, ArmWindow]:
    """Two arms over the same 60 one-second units; `shared`: sd of a per-unit load factor both
    arms share (0: independent arms)."""
    load = rng.normal(0.0, shared, UNITS) if shared else np.zeros(UNITS)
    out = []
    for scale in (1.0, speedup):
        unit = rng.integers(0, UNITS, n)
        ttft = rng.lognormal(np.log(0.1), 0.2, n)  # prefill: the same on both arms
        out.append(_window(np.exp(rng.normal(0.0, 0.3, n) + load[unit]) / scale, unit, ttft=ttft))
    return out[0], out[1]


def test_split_by_default_paired_when_pairs_cover_the_smaller_arm() -> None:
    rng = np.random.default_rng(1)
    control, treatment = _arms(rng, n=800)
    split = compare_window(control, treatment, engine=ENGINE, settings=SETTINGS, seed=[1])
    assert split["design"] == "split" and split["pairs"] == 0
    n = 900  # mirrored: every request also ran on the other arm
    unit = rng.integers(0, UNITS, n)
    base = rng.lognormal(0.0, 0.3, n)
    spec = base / 1.3 * rng.lognormal(0.0, 0.05, n)
    pairs = Pairs(
        {m: base / d for m, d in (("e2e", 1), ("ttft", 5), ("tpot", 50))},
        {m: spec / d for m, d in (("e2e", 1), ("ttft", 5), ("tpot", 50))},
        {m: unit for m in ("e2e", "ttft", "tpot")},
        UNITS,
        1.0,
    )
    paired = compare_window(
        control, treatment, engine=ENGINE, settings=SETTINGS, seed=[1], pairs=pairs
    )
    assert paired["design"] == "paired" and paired["pairs"] == n
    e2e = paired["metrics"]["e2e"]
    assert e2e["n"] == {"baseline": n, "speculative": n}
    seq = e2e["sequential"]
    assert seq is not None and seq.get("p99", {}).get("tests") == ["union_bound", "two_sample"]
    # pairs are far tighter than the split arms: the paired median interval is narrower
    narrow = paired["metrics"]["e2e"]["speedup"]["median"]
    wide = split["metrics"]["e2e"]["speedup"]["median"]
    assert narrow["lower"] is not None and narrow["upper"] is not None
    assert wide["lower"] is not None and wide["upper"] is not None
    assert narrow["upper"] - narrow["lower"] < wide["upper"] - wide["lower"]


def test_the_headline_reads_the_verdicts_the_windows_memory_holds() -> None:
    control, treatment = _arms(np.random.default_rng(2))

    def remember_a_ttft_crossing(metric: str, now: Evidence) -> Decision:
        if metric != "ttft":
            return Decision(now, now, "first", 1)
        held = dataclasses.replace(now, slower=EProcess(9.0, now.slower.boundary, True))
        return Decision(held, now, "intersected", 2)

    plain = compare_window(control, treatment, engine=ENGINE, settings=SETTINGS, seed=[2])
    assert plain["diagnosis"]["summary"].startswith("speculation helps")
    held = compare_window(
        control,
        treatment,
        engine=ENGINE,
        settings=SETTINGS,
        seed=[2],
        recall=remember_a_ttft_crossing,
    )
    ttft = held["metrics"]["ttft"]
    assert ttft["verdict"] == "slower"
    seq = ttft["sequential"]
    assert seq is not None and seq["hysteresis"] == "intersected"
    assert seq["p99"]["exceedance_slower"]["sticky"] and seq["decided_by"] == ["p99_exceedance"]
    summary = held["diagnosis"]["summary"]
    assert "TTFT P99 slower" in summary and not summary.startswith("speculation helps")
    codes = [r["code"] for r in held["diagnosis"]["reasons"]]
    assert "slower_verdict" in codes and "working" not in codes
    # everything else is this tick's: the same draws (the same seed) as without the memory
    for metric in ("e2e", "tpot"):
        assert held["metrics"][metric]["speedup"] == plain["metrics"][metric]["speedup"]
        assert held["metrics"][metric]["verdict"] == plain["metrics"][metric]["verdict"]


def test_the_length_adjustment_is_named_unavailable_without_moments() -> None:
    rng = np.random.default_rng(3)
    unit = rng.integers(0, UNITS, 500)
    with_moments = compare_window(
        _window(rng.lognormal(0, 0.3, 500), unit, moments=True),
        _window(rng.lognormal(0, 0.3, 500) / 1.2, unit, moments=True),
        engine=ENGINE,
        settings=SETTINGS,
        seed=[3],
    )
    assert with_moments.get("unavailable") == []
    assert with_moments["metrics"]["e2e"]["adjusted"] is not None
    without = compare_window(*_arms(rng, n=500), engine=ENGINE, settings=SETTINGS, seed=[3])
    assert without.get("unavailable") == ["adjusted"]
    assert without["metrics"]["e2e"]["adjusted"] is None


def test_an_interval_note_claims_shared_load_only_where_it_was_measured() -> None:
    """A block interval narrower than the i.i.d. one says so with its width ratio; it names the
    arms' shared per-unit load only when their per-unit means were measured to correlate."""
    plan = BlockPlan(units=60, block_units=2, blocks=30, politis_white=1.0, reliable=True)
    iid = Interval(1.3, 1.2, 1.4)
    narrow = np.full(400, 1.3) * np.exp(np.linspace(-0.04, 0.04, 400))
    for correlation in (None, 0.05, 0.9):
        chosen = blockboot._choose(1.3, narrow, iid, plan, 0.95, correlation)
        assert chosen.reported == "block" and chosen.differs and chosen.width_ratio < 0.8
        note = chosen.reason or ""
        assert "as wide as the i.i.d. one" in note
        if correlation is not None and correlation >= blockboot.MEASURED_CORRELATION:
            assert f"correlate at r = {correlation:.2f}" in note
        else:
            assert "share" not in note and "correlate" not in note, note
    # measured on two arms: independent arms do not correlate, arms sharing a load do
    rng = np.random.default_rng(4)
    independent = _arms(rng, shared=0.0)
    shared = _arms(rng, shared=0.5)
    r_independent = blockboot.unit_correlation(
        independent[0].samples["e2e"], independent[1].samples["e2e"]
    )
    r_shared = blockboot.unit_correlation(shared[0].samples["e2e"], shared[1].samples["e2e"])
    assert r_independent is not None and abs(r_independent) < blockboot.MEASURED_CORRELATION
    assert r_shared is not None and r_shared > 0.9


def test_an_interval_within_a_few_grid_bounds_says_so() -> None:
    plan = BlockPlan(units=720, block_units=60, blocks=12, politis_white=1.0, reliable=False)
    narrow = blockboot.BlockInterval(
        Interval(1.2, 1.195, 1.205), Interval(1.2, 1.19, 1.21), "iid", False, 1.0, None
    )
    boot = blockboot.BlockBootstrapResult(plan, {"median": narrow})
    coarse = speedup_block(boot, 10**6, 10**6, 0.95, grid_error=0.005)["median"]
    assert "within 5x of the 0.50%" in (coarse.get("interval_note") or "")
    fine = speedup_block(boot, 10**6, 10**6, 0.95, grid_error=0.0002)["median"]
    assert fine.get("interval_note") is None


def test_an_overloaded_window_says_it_measures_queueing_and_a_healthy_one_does_not() -> None:
    rng = np.random.default_rng(9)
    control, treatment = _arms(rng, n=1200)
    healthy = compare_window(control, treatment, engine=ENGINE, settings=SETTINGS, seed=[4])
    assert "queueing" not in healthy["diagnosis"]["summary"]
    assert healthy["diagnosis"]["queueing"] == []
    # the baseline's queue grows for the whole window: each request waits 0.1 s per unit longer
    unit = np.sort(rng.integers(0, UNITS, 1200))
    e2e = np.exp(rng.normal(0.0, 0.3, 1200))
    wait: FloatArray = 0.1 * unit.astype(np.float64)
    queued = _window(e2e + wait, unit, ttft=0.1 + wait)
    loaded = compare_window(queued, treatment, engine=ENGINE, settings=SETTINGS, seed=[4])
    summary = loaded["diagnosis"]["summary"]
    assert summary.startswith("overloaded: this comparison is measuring queueing, not spec")
    assert "baseline TTFT" in summary
    rises = {(g["arm"], g["metric"]) for g in loaded["diagnosis"]["queueing"]}
    assert rises == {("baseline", "TTFT"), ("baseline", "TPOT")}  # this fixture's TPOT is E2E/50
