"""The condition keys of `summary.conditions` for rows as column arrays (numpy): the same keys
the store's writer gives each request (`condition_keys`), for the rows a small run is read from
(`stats.job.rows`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.summary.conditions import EDGES, edge_names, load_key

__all__ = ["dimension_keys", "edge_bands", "temperature_bands"]

Labels = npt.NDArray[np.object_]


def edge_bands(dim: str, values: npt.ArrayLike) -> Labels:
    """`conditions.edge_band` of each value ("" where it has none)."""
    v = np.asarray(values, dtype=np.float64)
    edges = np.asarray(EDGES[dim][1], dtype=np.float64)
    out = np.full(v.size, "", dtype=object)
    ok = np.isfinite(v) & (v >= edges[0])
    at = np.searchsorted(edges, v[ok], side="right") - 1
    out[ok] = np.asarray(edge_names(dim), dtype=object)[at]
    return out


def temperature_bands(values: npt.ArrayLike) -> Labels:
    """`conditions.temperature_band` of each value (NaN: "default")."""
    t = np.asarray(values, dtype=np.float64)
    out = np.full(t.size, "default", dtype=object)
    given = np.isfinite(t)
    out[given & (t == 0)] = "0"
    out[given & (t > 0) & (t <= 0.5)] = "(0,0.5]"
    out[given & (t > 0.5) & (t <= 1)] = "(0.5,1]"
    out[given & (t > 1)] = ">1"
    return out


def _load_keys(values: npt.ArrayLike) -> Labels:
    v = np.asarray(values, dtype=np.float64)
    out = np.full(v.size, "", dtype=object)
    ok = np.flatnonzero(np.isfinite(v) & (v >= 1))
    loads, at = np.unique(np.floor(v[ok]).astype(np.int64), return_inverse=True)
    names = np.array([f"load={load_key(n)}" for n in loads.tolist()], dtype=object)
    out[ok] = names[at.reshape(-1)] if ok.size else names[:0]
    return out


def dimension_keys(columns: Mapping[str, npt.NDArray[Any]], n: int) -> dict[str, Labels]:
    """Per dimension each row's key ("" where it has none), as `condition_keys` gives them, of
    rows as column arrays (`stats.job.rows.ROW_COLUMNS`; a missing column: no such condition)."""

    def numbers(name: str) -> npt.NDArray[np.float64]:
        values = columns.get(name)
        if values is None:
            return np.full(n, np.nan)
        return np.array([np.nan if v is None else v for v in values.tolist()], dtype=np.float64)

    out = {"load": _load_keys(numbers(EDGES["load"][0]))}
    for dim in ("prompt", "output"):
        bands = edge_bands(dim, numbers(EDGES[dim][0]))
        out[dim] = np.array([f"{dim}={b}" if b else "" for b in bands.tolist()], dtype=object)
    temps = temperature_bands(numbers("temperature"))
    out["temperature"] = np.array([f"temperature={b}" for b in temps.tolist()], dtype=object)
    cats = columns.get("category")
    out["category"] = np.array(
        [f"category={c}" if isinstance(c, str) and c else "" for c in cats.tolist()]
        if cats is not None
        else [""] * n,
        dtype=object,
    )
    return out
