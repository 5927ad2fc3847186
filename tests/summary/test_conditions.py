"""Condition keys: the writer's scalar keys and the rows' array keys agree, the bands, and the
bound on load keys."""

from __future__ import annotations

import numpy as np
import pytest

from specproxy.summary.condition_arrays import dimension_keys, edge_bands, temperature_bands
from specproxy.summary.conditions import (
    DIMENSIONS,
    LOAD_EXACT_MAX,
    condition_keys,
    edge_band,
    edge_names,
    key_load,
    key_load_error,
    load_key,
    temperature_band,
)
from specproxy.summary.grid import coarse_centre_of
from specproxy.summary.histogram import bin_index, coarse_as_fine, coarse_bin


def test_edge_bands_name_their_ranges() -> None:
    assert edge_names("load") == ("1", "2-3", "4-7", "8-15", "16-31", "32+")
    assert edge_names("prompt") == ("<128", "128-511", "512-2047", "2048-8191", "8192+")
    loads = np.array([1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 500, np.nan, 0])
    pairs = ["2-3", "2-3", "4-7", "4-7", "8-15", "8-15", "16-31", "16-31", "32+", "32+"]
    assert edge_bands("load", loads).tolist() == ["1", *pairs, "", ""]
    prompt = edge_bands("prompt", np.array([5.0, 128, 9000]))
    assert prompt.tolist() == ["<128", "128-511", "8192+"]


def test_temperature_bands() -> None:
    t = [0.0, 0.2, 0.5, 0.7, 1.0, 1.5, None]
    want = ["0", "(0,0.5]", "(0,0.5]", "(0.5,1]", "(0.5,1]", ">1", "default"]
    assert [temperature_band(x) for x in t] == want
    assert temperature_bands(np.array(t, dtype=np.float64)).tolist() == want


def test_load_keys_are_exact_then_a_quarter_of_a_doubling_and_never_straddle_a_band() -> None:
    assert [load_key(n) for n in range(1, LOAD_EXACT_MAX)] == list(range(1, LOAD_EXACT_MAX))
    assert [load_key(n) for n in (8, 9, 10, 15, 16, 19, 20, 26, 32, 39, 40)] == [
        8, 8, 10, 14, 16, 16, 20, 24, 32, 32, 40,
    ]  # fmt: skip
    assert key_load(24) == 25.5 and key_load(5) == 5.0
    assert key_load_error(26.3) == 1.5 and key_load_error(5.0) == 0.0
    keys = {load_key(n) for n in range(1, 1 << 20)}
    assert len(keys) == LOAD_EXACT_MAX - 1 + 4 * (20 - 3)  # 4 per doubling from 8 to 2^20
    for n in range(1, 5000):  # a key's loads all lie in one load band
        k = load_key(n)
        assert edge_band("load", n) == edge_band("load", k)
        assert abs(key_load(k) - n) <= key_load_error(n)


def test_the_rows_keys_are_the_writers_keys() -> None:
    rng = np.random.default_rng(0)
    n = 3000
    loads = rng.integers(0, 3000, n).astype(object)
    loads[::7] = None
    prompt = rng.integers(1, 20000, n).astype(object)
    prompt[::5] = None
    output = rng.integers(0, 4000, n).astype(object)
    temps = rng.choice(np.array([0.0, 0.3, 0.5, 0.9, 1.0, 1.7, None], dtype=object), n)
    cats = rng.choice(np.array(["code", "chat", None, ""], dtype=object), n)
    columns = {
        "endpoint_in_flight": loads,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "temperature": temps,
        "category": cats,
    }
    arrays = dimension_keys(columns, n)
    for i in range(n):
        want = condition_keys(loads[i], prompt[i], output[i], temps[i], cats[i])
        got = [arrays[dim][i] for dim in DIMENSIONS if arrays[dim][i]]
        assert got == want, i
    assert dimension_keys({}, 2)["temperature"].tolist() == ["temperature=default"] * 2


@pytest.mark.parametrize("value", [1e-6, 0.0123, 0.5, 1.0, 3.7, 12345.0])
def test_coarse_centre_is_the_compacted_blocks_bin(value: float) -> None:
    v = np.array([value, value * 1.003, value * 0.997])
    want = coarse_as_fine(coarse_bin(bin_index(v))).tolist()
    assert [coarse_centre_of(float(x)) for x in v] == want
