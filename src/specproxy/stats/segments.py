"""Where speculation helps: the speedup by the conditions each request met, and the crossover.

Each request carries its conditions (`records.RequestRecord`: calls in flight at its engine when
it was sent, prompt and output tokens, temperature, category), and is summarised under a key per
condition (`summary.conditions`: "load=7", "prompt=<128", "category=code", ...) beside its
model's summaries, on the coarse grid. A window's condition summaries (`ConditionSource`: from
the store, or built the same way from a small run's rows, `stats.job.rows`) give each band of
each arm as an `ArmSample`, the one sample form, compared by the same block bootstrap as the
whole window (`estimate.blockboot`): the median's speedup with its interval and the n behind it.
One condition at a time (no cross product). A band where either arm holds fewer than
`MIN_BAND_REQUESTS` says "too_little_data" and shows no number.

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

The crossover (`estimate.crossover`) of a run read as rows takes each request at its own load and
latency; from the summaries it reads each load key's sample as cells per time unit, at the key's
middle (`summary.conditions.key_load`), its bounds widened by the binning's bound on their log
latencies and by half the key's width.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Final, Protocol

import numpy as np

from specproxy.stats.estimate.blockboot import block_speedup_intervals
from specproxy.stats.estimate.crossover import LoadSample, binned_log_error, crossover
from specproxy.stats.result import BandSpeedup, Conditions, CrossoverResult
from specproxy.stats.sample import ArmSample
from specproxy.summary.conditions import (
    DIMENSIONS,
    EDGES,
    TEMPERATURE_BANDS,
    edge_band,
    edge_names,
    key_load,
    key_load_error,
    split_key,
)

__all__ = [
    "CATEGORIES_MAX",
    "DIMENSIONS",
    "LOAD_COLUMN",
    "MIN_BAND_REQUESTS",
    "SEGMENT_METRICS",
    "ConditionSource",
    "band_keys",
    "conditional",
    "crossover_words",
]

MIN_BAND_REQUESTS: Final = 30
CATEGORIES_MAX: Final = 16
LOAD_COLUMN: Final = EDGES["load"][0]
SEGMENT_METRICS: Final = ("e2e", "tpot")
STATISTIC: Final = "median"
OTHER: Final = "other"


class ConditionSource(Protocol):
    """One arm's condition summaries over a window (`stats.job.frame.ConditionSamples`)."""

    def keys(self, metric: str) -> list[str]: ...

    def count(self, metric: str, key: str) -> int: ...

    def sample(self, metric: str, keys: frozenset[str]) -> ArmSample: ...


def _band_of(dim: str, value: str) -> str:
    """The band a condition key's value lies in (load keys: by the load they stand for)."""
    if dim == "load":
        return edge_band("load", key_load(int(value))) or ""
    return value


def band_keys(
    dim: str, keys: list[str], counts: dict[str, int]
) -> list[tuple[str, frozenset[str]]]:
    """(band, the keys it gathers) of one dimension, in the bands' order. Categories: the
    `CATEGORIES_MAX` with the most requests (`counts`, ties by name), the rest "other" (each
    proxy bounded its own, and their union may hold more)."""
    values = [split_key(k)[1] for k in keys if split_key(k)[0] == dim]
    by_band: dict[str, set[str]] = {}
    if dim == "category":
        ranked = sorted(values, key=lambda v: (-counts.get(f"category={v}", 0), v))
        kept = {v for v in ranked[:CATEGORIES_MAX] if v != OTHER}
        for v in values:
            by_band.setdefault(v if v in kept else OTHER, set()).add(f"{dim}={v}")
        order = sorted(by_band, key=lambda b: (b == OTHER, b))
    else:
        for v in values:
            band = _band_of(dim, v)
            if band:
                by_band.setdefault(band, set()).add(f"{dim}={v}")
        names = TEMPERATURE_BANDS if dim == "temperature" else edge_names(dim)
        order = [b for b in names if b in by_band]
    return [(band, frozenset(by_band[band])) for band in order]


def _speedup(
    c: ArmSample, t: ArmSample, rng: np.random.Generator, resamples: int, confidence: float
) -> BandSpeedup:
    out: BandSpeedup = {
        "band": "",
        "n": {"control": c.n, "treatment": t.n},
        "status": "too_little_data",
        "speedup": None,
        "lower": None,
        "upper": None,
    }
    if c.n < MIN_BAND_REQUESTS or t.n < MIN_BAND_REQUESTS:
        return out
    found = block_speedup_intervals(
        c, t, statistics=(STATISTIC,), rng=rng, resamples=resamples, confidence=confidence
    ).intervals[STATISTIC]
    shown = found.interval

    def finite(x: float) -> float | None:
        return float(x) if math.isfinite(x) else None

    out["status"] = "ok"
    out["speedup"] = finite(shown.estimate)
    out["lower"] = finite(shown.lower)
    out["upper"] = finite(shown.upper)
    return out


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
    control: ConditionSource,
    treatment: ConditionSource,
    *,
    units: int,
    rng: np.random.Generator,
    resamples: int,
    confidence: float,
    loads: Mapping[str, tuple[LoadSample, LoadSample]] | None = None,
) -> Conditions:
    """The window's speedups by condition band and its crossover loads (module docstring).
    `units`: the window's time units (the samples' own). `loads`: per metric (control,
    treatment) cells of each request at its own load and latency (a run read as rows), for the
    crossover; else it reads the load keys' samples."""
    segments: dict[str, dict[str, list[BandSpeedup]]] = {}
    crossovers: dict[str, CrossoverResult] = {}
    for metric in SEGMENT_METRICS:
        # a stream each for the bands and the crossover: the bands draw the same replicates
        # whichever cells the crossover reads (rows or summaries)
        band_rng, load_rng = rng.spawn(2)
        keys = sorted(set(control.keys(metric)) | set(treatment.keys(metric)))
        counts = {
            k: control.count(metric, k) + treatment.count(metric, k)
            for k in keys
            if split_key(k)[0] == "category"
        }
        cells: tuple[LoadSample, LoadSample] | None = None
        piece_units, log_error = 1, 0.0
        for dim in DIMENSIONS:
            # each key's sample once (one pass over its summaries), a band the merge of its keys'
            members_of = band_keys(dim, keys, counts)
            each = {
                arm: {k: source.sample(metric, frozenset({k})) for _b, ks in members_of for k in ks}
                for arm, source in (("control", control), ("treatment", treatment))
            }
            bands: list[BandSpeedup] = []
            for band, members in members_of:
                found = _speedup(
                    ArmSample.merged([each["control"][k] for k in sorted(members)]),
                    ArmSample.merged([each["treatment"][k] for k in sorted(members)]),
                    band_rng,
                    resamples,
                    confidence,
                )
                found["band"] = band
                if dim == "load":  # where it was measured: the band's mean calls in flight
                    weights = [
                        (key_load(int(split_key(k)[1])), each[arm][k].n)
                        for arm in ("control", "treatment")
                        for k in members
                    ]
                    total = sum(n for _x, n in weights)
                    if total:
                        found["load"] = sum(x * n for x, n in weights) / total
                bands.append(found)
            segments.setdefault(dim, {})[metric] = bands
            if dim == "load" and each["control"]:
                # the crossover's cells: each load key's sample at the load it stands for
                c_cells, t_cells = (
                    LoadSample.joined(
                        LoadSample.of_sample(key_load(int(split_key(k)[1])), sample)
                        for k, sample in each[arm].items()
                    )
                    for arm in ("control", "treatment")
                )
                cells = (c_cells, t_cells)
                some = next(iter(each["control"].values()))
                piece_units, log_error = some.piece_units, binned_log_error(some)
        exact = loads.get(metric) if loads is not None else None
        if exact is not None:
            found_load = crossover(
                *exact, units=units, rng=load_rng, resamples=resamples, confidence=confidence
            )
        else:
            empty = LoadSample.joined([])
            found_load = crossover(
                *(cells or (empty, empty)),
                units=units,
                rng=load_rng,
                resamples=resamples,
                confidence=confidence,
                piece_units=piece_units,
                log_error=log_error,
                load_error=key_load_error,
            )
        crossovers[metric] = found_load.to_dict()
    tpot = crossovers.get("tpot")
    return {
        "statistic": STATISTIC,
        "min_band_requests": MIN_BAND_REQUESTS,
        "load": LOAD_COLUMN,
        "segments": segments,
        "crossover": crossovers,
        "summary": crossover_words(tpot) if tpot is not None else None,
    }
