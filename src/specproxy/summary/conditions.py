"""The conditions a request met, as summary keys: what the speedups by condition are read from.

Each usable primary request is rolled up once per condition it states (`summary.minute`), under
the metrics `CONDITION_METRICS` (its E2E and TPOT) with a key "DIMENSION=VALUE":

  load=N         its arm's calls in flight at its engine when sent (`endpoint_in_flight`), itself
                 included: exact below `LOAD_EXACT_MAX` (8), from it one key per quarter of a
                 doubling (N its lower edge: 8-9, 10-11, ..., 16-19, ...), so 19 keys up to 63
                 and at most 7 + 4 x 28 for a 32-bit count; the crossover load
                 (`stats.estimate.crossover`) reads a key at its middle (`key_load`), within
                 `key_load_error` of its requests' own loads
  prompt=BAND    prompt tokens: <128, 128-511, 512-2047, 2048-8191, 8192+
  output=BAND    output tokens: <32, 32-127, 128-511, 512-2047, 2048+
  temperature=B  0, (0,0.5], (0.5,1], >1; "default" when the body gave none
  category=C     the client's category (bounded where it is read: `proxy.conditions`, bench)

A request without a condition (no load, no token count, no category) has no key of it. Load
bands (1, 2-3, 4-7, 8-15, 16-31, 32+) are unions of load keys: a key never straddles a power of
two. Condition rollups are binned on the coarse grid (`grid.coarse_centre_of`, 0.5 %): each key
is a slice of the traffic, and fine bins for each would write about a row per request.

Pure Python: it runs on the store's write path (which loads no numpy); `summary.condition_arrays`
gives the same keys for the rows the statistics read (`stats.job.rows`), and tests hold them
equal.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = [
    "CONDITION_METRICS",
    "DIMENSIONS",
    "EDGES",
    "LOAD_EXACT_MAX",
    "TEMPERATURE_BANDS",
    "condition_keys",
    "edge_band",
    "edge_names",
    "key_load",
    "key_load_error",
    "load_key",
    "split_key",
    "temperature_band",
]

# condition metric -> (the compared metric it stands for, the record attribute)
CONDITION_METRICS: Final[dict[str, tuple[str, str]]] = {
    "cond_e2e": ("e2e", "e2e_s"),
    "cond_tpot": ("tpot", "tpot_s"),
}
DIMENSIONS: Final = ("load", "prompt", "output", "temperature", "category")
# dimension -> (record attribute, band edges); the first band of prompt and output is "<edge 1"
EDGES: Final[dict[str, tuple[str, tuple[int, ...]]]] = {
    "load": ("endpoint_in_flight", (1, 2, 4, 8, 16, 32)),
    "prompt": ("prompt_tokens", (1, 128, 512, 2048, 8192)),
    "output": ("output_tokens", (1, 32, 128, 512, 2048)),
}
TEMPERATURE_BANDS: Final = ("0", "(0,0.5]", "(0.5,1]", ">1", "default")
LOAD_EXACT_MAX: Final = 8  # a power of two, at least 4
_LOAD_STEPS_PER_DOUBLING_LOG2: Final = 2  # 4 keys per doubling from LOAD_EXACT_MAX


def edge_names(dim: str) -> tuple[str, ...]:
    """The band names of an edged dimension ("2-3", "32+"; "<128" first for token counts)."""
    _column, edges = EDGES[dim]
    names = []
    for i, lo in enumerate(edges):
        if i == len(edges) - 1:
            names.append(f"{lo}+")
        elif dim != "load" and i == 0:
            names.append(f"<{edges[1]}")
        else:
            hi = edges[i + 1] - 1
            names.append(str(lo) if hi == lo else f"{lo}-{hi}")
    return tuple(names)


_NAMES: Final = {dim: edge_names(dim) for dim in EDGES}


def edge_band(dim: str, value: float | None) -> str | None:
    """The band of `value` in an edged dimension; None when it is missing or below the first."""
    if value is None or not math.isfinite(value):
        return None
    edges = EDGES[dim][1]
    if value < edges[0]:
        return None
    i = len(edges) - 1
    while value < edges[i]:
        i -= 1
    return _NAMES[dim][i]


def temperature_band(t: float | None) -> str:
    """0, (0,0.5], (0.5,1], >1; "default" where the request gave none."""
    if t is None or not math.isfinite(t):
        return "default"
    if t == 0:
        return "0"
    if t <= 0.5:
        return "(0,0.5]"
    if t <= 1:
        return "(0.5,1]"
    return ">1"


def load_key(n: int) -> int:
    """The load key of `n` >= 1 calls in flight: `n` below `LOAD_EXACT_MAX`, else the lower edge
    of its quarter of a doubling."""
    if n < LOAD_EXACT_MAX:
        return n
    step = 1 << (n.bit_length() - 1 - _LOAD_STEPS_PER_DOUBLING_LOG2)
    return n - n % step


def _load_step(key: int) -> int:
    if key < LOAD_EXACT_MAX:
        return 1
    return 1 << (key.bit_length() - 1 - _LOAD_STEPS_PER_DOUBLING_LOG2)


def key_load(key: int) -> float:
    """The load a key stands for: itself when exact, else the middle of its calls in flight."""
    return key + (_load_step(key) - 1) / 2


def key_load_error(load: float) -> float:
    """How far the load a key stands for may lie from its requests' own, for the key holding
    `load` (0 below `LOAD_EXACT_MAX`)."""
    return (_load_step(load_key(max(1, math.floor(load)))) - 1) / 2


def condition_keys(
    endpoint_in_flight: int | None,
    prompt_tokens: int | None,
    output_tokens: int | None,
    temperature: float | None,
    category: str | None,
) -> list[str]:
    """The summary keys of one request's conditions (module docstring)."""
    keys = []
    if endpoint_in_flight is not None and endpoint_in_flight >= 1:
        keys.append(f"load={load_key(int(endpoint_in_flight))}")
    for dim, value in (("prompt", prompt_tokens), ("output", output_tokens)):
        band = edge_band(dim, value)
        if band is not None:
            keys.append(f"{dim}={band}")
    keys.append(f"temperature={temperature_band(temperature)}")
    if category:
        keys.append(f"category={category}")
    return keys


def split_key(key: str) -> tuple[str, str]:
    """(dimension, value) of a condition key."""
    dim, _, value = key.partition("=")
    return dim, value
