"""Compacted rollup blocks: exact per-minute sums, a coarse histogram within the stated bound,
lossless encoding, and merging by addition."""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from specproxy.summary.blocks import Block
from specproxy.summary.grid import COARSE_ERROR_BOUND, COARSE_FACTOR, GRID_LOG_WIDTH
from specproxy.summary.histogram import bin_centres, bin_index, coarse_bin
from specproxy.summary.tiering import HOUR_SPAN
from tests.summary.helpers import block_entries


def _fine_block(
    rng: np.random.Generator, start: int, span: int, per_minute: int
) -> tuple[Block, np.ndarray]:
    minutes = np.repeat(np.arange(start, start + span), per_minute)
    values = rng.lognormal(0.0, 0.7, minutes.size)
    fine = bin_index(values)
    bins, counts = np.unique(fine, return_counts=True)
    block = Block.of_fine(
        start,
        span,
        minute=np.arange(start, start + span),
        n=np.full(span, per_minute),
        total=np.bincount(minutes - start, weights=values).astype(np.float64),
        total_sq=np.bincount(minutes - start, weights=values * values).astype(np.float64),
        bins=bins,
        counts=counts,
    )
    return block, values


def test_a_block_keeps_exact_minute_sums_and_each_value_within_half_a_coarse_bin() -> None:
    rng = np.random.default_rng(1)
    block, values = _fine_block(rng, 600, HOUR_SPAN, 50)
    assert block.n == values.size
    assert block.minute_n.tolist() == [50] * HOUR_SPAN
    assert np.isclose(block.minute_total.sum(), values.sum(), rtol=1e-12)
    bins, counts = block_entries(block)
    assert int(counts.sum()) == values.size
    # each value's coarse bin, stood for by its centre, is within exp(+-C d / 2) of the value
    centre = bin_centres(coarse_bin(bin_index(values)) * COARSE_FACTOR + COARSE_FACTOR // 2)
    assert np.all(np.abs(np.log(centre / values)) <= COARSE_FACTOR * GRID_LOG_WIDTH / 2 + 1e-12)
    # the histogram is the coarse binning of the values
    c, k = np.unique(coarse_bin(bin_index(values)), return_counts=True)
    assert bins.tolist() == (c * COARSE_FACTOR + COARSE_FACTOR // 2).tolist()
    assert counts.tolist() == k.tolist()
    # so a quantile of it is within half a coarse bin, a ratio within COARSE_ERROR_BOUND
    srt = np.sort(values)
    cum = np.cumsum(counts)
    for p in (0.5, 0.9, 0.99):
        rank = int(np.floor((values.size - 1) * p))
        got = float(bin_centres(bins[np.searchsorted(cum, rank, side="right")]))
        assert abs(np.log(got / srt[rank])) <= np.log1p(COARSE_ERROR_BOUND) / 2 + 1e-12


@pytest.mark.parametrize("span", [1, HOUR_SPAN])
def test_encoding_is_lossless(span: int) -> None:
    block, _ = _fine_block(np.random.default_rng(2), 1200, span, 300)
    back = Block.decode(1200, block.encode())
    assert (back.start, back.span, back.lo) == (block.start, block.span, block.lo)
    for a, b in (
        (back.minute_n, block.minute_n),
        (back.minute_total, block.minute_total),
        (back.minute_sq, block.minute_sq),
        (back.counts, block.counts),
    ):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()  # bit for bit
    with pytest.raises(ValueError):
        Block.decode(1200, zlib.compress(zlib.decompress(block.encode())[:-8]))


def test_combining_blocks_adds_them_and_equals_the_block_of_all_rows() -> None:
    rng = np.random.default_rng(3)
    parts = [_fine_block(rng, 60 + i, 1, 40 + i)[0] for i in range(0, 60, 7)]
    hour = Block.combine(60, HOUR_SPAN, parts)
    assert hour.n == sum(p.n for p in parts)
    for p in parts:
        assert hour.minute_n[p.start - 60] == p.n
        assert hour.minute_total[p.start - 60] == p.minute_total[0]
    pooled: dict[int, int] = {}
    for p in parts:
        for b, c in zip(*block_entries(p), strict=True):
            pooled[int(b)] = pooled.get(int(b), 0) + int(c)
    bins, counts = block_entries(hour)
    assert dict(zip(bins.tolist(), counts.tolist(), strict=True)) == pooled
    # adding in any grouping gives the same block (what late folds rely on)
    two_step = Block.combine(60, HOUR_SPAN, [Block.combine(60, HOUR_SPAN, parts[:3]), *parts[3:]])
    assert np.array_equal(two_step.counts, hour.counts) and two_step.lo == hour.lo
    with pytest.raises(ValueError, match="outside"):
        Block.combine(60, HOUR_SPAN, [_fine_block(rng, 130, 1, 5)[0]])
