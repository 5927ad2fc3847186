"""Where speculation helps: the speedup by the conditions each request met, and the crossover.

Each request carries its conditions (`records.RequestRecord`: calls in flight at its engine when
it was sent, prompt and output tokens, temperature, category). One condition at a time (no cross
product), its requests fall into bands, and each band of each arm becomes an `ArmSample` over the
window's time units, compared by the same block bootstrap as the whole window
(`estimate.blockboot`): the median's speedup with its interval and the n behind it. A band where
either arm holds fewer than `MIN_BAND_REQUESTS` says "too_little_data" and shows no number.

Bands (a request without the condition is in none of its bands):
  load         1, 2-3, 4-7, 8-15, 16-31, 32+ (each arm's own calls in flight at its engine)
  prompt       <128, 128-511, 512-2047, 2048-8191, 8192+ tokens
  output       <32, 32-127, 128-511, 512-2047, 2048+ tokens
  temperature  0, (0,0.5], (0.5,1], >1, default (not given: the engine's default)
  category     the `CATEGORIES_MAX` most frequent categories of the window, the rest "other"
so a window holds at most 6 + 5 + 5 + 5 + 17 = 38 bands per metric (`SEGMENT_METRICS`).

Comparing within a load band compares like with like: each arm's band holds its requests that
met that load on its own engine, so a treatment that is faster (and so holds fewer requests in
flight at the same arrival rate) is compared with the control at the load each actually served.

Pure numpy, from the rows of a window (`stats.job.rows`); the crossover: `estimate.crossover`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproxy.stats.estimate.blockboot import block_speedup_intervals
from specproxy.stats.estimate.crossover import LoadSample, crossover
from specproxy.stats.result import BandSpeedup, Conditions, CrossoverResult
from specproxy.stats.sample import ArmSample

__all__ = [
    "CATEGORIES_MAX",
    "DIMENSIONS",
    "LOAD_COLUMN",
    "MIN_BAND_REQUESTS",
    "SEGMENT_METRICS",
    "ArmRows",
    "band_labels",
    "conditional",
    "crossover_words",
    "edge_bands",
    "temperature_bands",
]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
Labels = npt.NDArray[np.object_]

MIN_BAND_REQUESTS: Final = 30
CATEGORIES_MAX: Final = 16
LOAD_COLUMN: Final = "endpoint_in_flight"
SEGMENT_METRICS: Final[dict[str, str]] = {"e2e": "e2e_s", "tpot": "tpot_s"}
STATISTIC: Final = "median"
DIMENSIONS: Final = ("load", "prompt", "output", "temperature", "category")
_EDGES: Final[dict[str, tuple[str, tuple[int, ...]]]] = {
    "load": (LOAD_COLUMN, (1, 2, 4, 8, 16, 32)),
    "prompt": ("prompt_tokens", (1, 128, 512, 2048, 8192)),
    "output": ("output_tokens", (1, 32, 128, 512, 2048)),
}
TEMPERATURE_BANDS: Final = ("0", "(0,0.5]", "(0.5,1]", ">1", "default")


def edge_bands(values: FloatArray, edges: tuple[int, ...], *, first_is_below: bool) -> Labels:
    """Each value's band between consecutive `edges` ("2-3", "32+"; the first "<128" when
    `first_is_below`, else "1" or "1-127"); "" where the value is missing or below the first."""
    v = np.asarray(values, dtype=np.float64)
    names = []
    for i, lo in enumerate(edges):
        if i == len(edges) - 1:
            names.append(f"{lo}+")
        elif first_is_below and i == 0:
            names.append(f"<{edges[1]}")
        else:
            hi = edges[i + 1] - 1
            names.append(str(lo) if hi == lo else f"{lo}-{hi}")
    out = np.full(v.size, "", dtype=object)
    ok = np.isfinite(v) & (v >= edges[0])
    at = np.searchsorted(np.asarray(edges, dtype=np.float64), v[ok], side="right") - 1
    out[ok] = np.asarray(names, dtype=object)[at]
    return out


def temperature_bands(values: FloatArray) -> Labels:
    """0, (0,0.5], (0.5,1], >1; "default" where the request gave none."""
    t = np.asarray(values, dtype=np.float64)
    out = np.full(t.size, "default", dtype=object)
    given = np.isfinite(t)
    out[given & (t == 0)] = "0"
    out[given & (t > 0) & (t <= 0.5)] = "(0,0.5]"
    out[given & (t > 0.5) & (t <= 1)] = "(0.5,1]"
    out[given & (t > 1)] = ">1"
    return out


def _category_bands(both: tuple[npt.NDArray[Any], npt.NDArray[Any]]) -> tuple[Labels, Labels]:
    """The window's `CATEGORIES_MAX` most frequent categories (ties by name), the rest "other";
    "" where none was given. Bounded again here: each proxy bounded its own."""
    joined = [c for arm in both for c in arm.tolist() if isinstance(c, str) and c]
    names, counts = np.unique(np.asarray(joined, dtype=object), return_counts=True)
    ranked = sorted(zip(names.tolist(), counts.tolist(), strict=True), key=lambda p: (-p[1], p[0]))
    kept = {name for name, _ in ranked[:CATEGORIES_MAX]}

    def label(arm: npt.NDArray[Any]) -> Labels:
        return np.array(
            [("" if not (isinstance(c, str) and c) else c if c in kept else "other") for c in arm],
            dtype=object,
        )

    return label(both[0]), label(both[1])


@dataclass(frozen=True, slots=True)
class ArmRows:
    """One arm's usable primary requests of a window: each one's time unit (0..units-1) and its
    columns (`stats.job.rows.ROW_COLUMNS`)."""

    unit: IntArray
    columns: Mapping[str, npt.NDArray[Any]]

    @classmethod
    def of(
        cls,
        arrays: Mapping[str, npt.NDArray[Any]],
        *,
        lo: int,
        hi: int,
        unit_s: float,
        excluded: set[int],
    ) -> ArmRows:
        """The primary rows in units [lo, hi] of `unit_s` seconds, less the `excluded` ones."""
        primary = ~np.asarray(arrays["shadow"], dtype=bool)
        unit = np.floor(np.asarray(arrays["t_start"], dtype=np.float64) / unit_s).astype(np.int64)
        keep = primary & (unit >= lo) & (unit <= hi)
        if excluded:
            keep &= ~np.isin(unit, sorted(excluded))
        return cls(unit[keep] - lo, {c: np.asarray(a)[keep] for c, a in arrays.items()})

    def text(self, name: str) -> npt.NDArray[Any]:
        """A text column (None where missing, or where the rows lack the column)."""
        values = self.columns.get(name)
        return values if values is not None else np.full(self.unit.size, None, dtype=object)

    def column(self, name: str) -> FloatArray:
        values = self.columns.get(name)
        if values is None:
            return np.full(self.unit.size, np.nan)
        return np.array([np.nan if v is None else v for v in values.tolist()], dtype=np.float64)


def band_labels(control: ArmRows, treatment: ArmRows) -> dict[str, tuple[Labels, Labels]]:
    """Per dimension each arm's band of each request ("": in none)."""
    out: dict[str, tuple[Labels, Labels]] = {}
    for dim, (column, edges) in _EDGES.items():
        below = dim != "load"
        out[dim] = (
            edge_bands(control.column(column), edges, first_is_below=below),
            edge_bands(treatment.column(column), edges, first_is_below=below),
        )
    out["temperature"] = (
        temperature_bands(control.column("temperature")),
        temperature_bands(treatment.column("temperature")),
    )
    out["category"] = _category_bands((control.text("category"), treatment.text("category")))
    return out


def _band_order(dim: str, names: set[str]) -> list[str]:
    if dim == "temperature":
        return [b for b in TEMPERATURE_BANDS if b in names]
    if dim in _EDGES:
        return sorted(names, key=lambda b: int(b.lstrip("<").split("-")[0].rstrip("+")))
    return sorted(names, key=lambda b: (b == "other", b))


def _speedup(
    c: ArmSample, t: ArmSample, rng: np.random.Generator, resamples: int, confidence: float
) -> tuple[str, float | None, float | None, float | None]:
    if c.n < MIN_BAND_REQUESTS or t.n < MIN_BAND_REQUESTS:
        return "too_little_data", None, None, None
    found = block_speedup_intervals(
        c, t, statistics=(STATISTIC,), rng=rng, resamples=resamples, confidence=confidence
    ).intervals[STATISTIC]
    shown = found.interval

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    return "ok", finite(shown.estimate), finite(shown.lower), finite(shown.upper)


def crossover_words(found: CrossoverResult, metric: str = "TPOT") -> str | None:
    """The crossover as the diagnosis says it: "speculation helps below about 12 concurrent
    requests per engine [9, 15] (TPOT 1.62x), and costs 8% above"."""
    status = found["status"]
    seen = found["observed"]
    if status == "too_little_data" or seen is None:
        return None
    span = f"{seen[0]:.0f}-{seen[1]:.0f} concurrent requests per engine"
    if status == "helps_throughout":
        return f"speculation helps ({metric}) at every load observed ({span})"
    if status == "costs_throughout":
        return f"speculation costs ({metric}) at every load observed ({span})"
    load = found["load"]
    assert load is not None
    lo = f"{found['lower']:.0f}" if found["lower"] is not None else "below the range"
    hi = f"{found['upper']:.0f}" if found["upper"] is not None else "above the range"
    text = f"speculation helps below about {load:.0f} concurrent requests per engine [{lo}, {hi}]"
    below, above = found["speedup_below"], found["speedup_above"]
    if below is not None:
        text += f" ({metric} {below:.2f}x)"
    if above is not None:
        text += f", and costs {1 - above:.0%} above" if above < 1 else ", and about breaks even"
    return text


def conditional(
    control: ArmRows,
    treatment: ArmRows,
    *,
    units: int,
    unit_s: float,
    rng: np.random.Generator,
    resamples: int,
    confidence: float,
) -> Conditions:
    """The window's speedups by condition band and its crossover loads (module docstring)."""
    labels = band_labels(control, treatment)
    segments: dict[str, dict[str, list[BandSpeedup]]] = {}
    crossovers: dict[str, CrossoverResult] = {}
    for metric, column in SEGMENT_METRICS.items():
        c_values, t_values = control.column(column), treatment.column(column)
        c_ok = np.isfinite(c_values) & (c_values > 0)
        t_ok = np.isfinite(t_values) & (t_values > 0)
        for dim in DIMENSIONS:
            c_bands, t_bands = labels[dim]
            names = {b for b in (*c_bands.tolist(), *t_bands.tolist()) if b}
            bands: list[BandSpeedup] = []
            for band in _band_order(dim, names):
                c_in, t_in = c_ok & (c_bands == band), t_ok & (t_bands == band)
                c = ArmSample.from_values(c_values[c_in], control.unit[c_in], units, unit_s)
                t = ArmSample.from_values(t_values[t_in], treatment.unit[t_in], units, unit_s)
                status, est, lo, hi = _speedup(c, t, rng, resamples, confidence)
                bands.append(
                    {
                        "band": band,
                        "n": {"control": c.n, "treatment": t.n},
                        "status": "ok" if status == "ok" else "too_little_data",
                        "speedup": est,
                        "lower": lo,
                        "upper": hi,
                    }
                )
            segments.setdefault(dim, {})[metric] = bands
        found = crossover(
            LoadSample.of(control.column(LOAD_COLUMN), control.unit, c_values),
            LoadSample.of(treatment.column(LOAD_COLUMN), treatment.unit, t_values),
            units=units,
            rng=rng,
            resamples=resamples,
            confidence=confidence,
        )
        crossovers[metric] = found.to_dict()
    tpot = crossovers.get("tpot")
    return {
        "statistic": STATISTIC,
        "min_band_requests": MIN_BAND_REQUESTS,
        "load": LOAD_COLUMN,
        "segments": segments,
        "crossover": crossovers,
        "summary": crossover_words(tpot) if tpot is not None else None,
    }
