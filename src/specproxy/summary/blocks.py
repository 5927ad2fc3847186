"""The compacted rollup tier: a block of minutes of one (run, model, arm, metric) as one value.

Why: at 1k requests/s an arm's minute fills ~10k of the fine grid's 0.02 % bins, so per-minute
fine bin rows are about as many as requests (2.6 billion in 30 days). A block keeps
  * the exact per-minute count, sum and sum of squares of its `span` minutes (the warm-up rule,
    the mean and the block-length rule still see minutes), and
  * ONE histogram of all its requests on the coarse grid (`histogram.coarse_bin`, 0.5 % wide),
    dense over its occupied range: a few hundred counts instead of 10k rows per minute.
Compaction folds closed minutes into 1-minute blocks and old 1-minute blocks into hour blocks
(`summary.compaction`); blocks merge by addition like the fine rows, so a later pass can fold
late rows into a block without counting anything twice.

Encoding (`encode`/`decode`): zlib of little-endian int64 [span, lo, k], then minute_n int64[span],
minute_total float64[span], minute_sq float64[span], counts int64[k]. The store keeps the
encoding as an opaque blob with its `n`.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from specproxy.summary.histogram import coarse_bin

__all__ = ["Block"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

_I8: Final = np.dtype("<i8")
_F8: Final = np.dtype("<f8")


@dataclass(frozen=True, slots=True)
class Block:
    """Minutes [start, start + span) of one key: exact per-minute sums, one coarse histogram."""

    start: int
    span: int
    minute_n: IntArray  # (span,)
    minute_total: FloatArray  # (span,)
    minute_sq: FloatArray  # (span,)
    lo: int  # coarse bin of counts[0]
    counts: IntArray  # dense counts of coarse bins lo .. lo + len - 1

    @property
    def n(self) -> int:
        """Requests in the block: it only grows as rows are folded in (the readers' version)."""
        return int(self.minute_n.sum())

    def encode(self) -> bytes:
        head = np.array([self.span, self.lo, self.counts.size], dtype=_I8)
        parts = (
            head,
            self.minute_n.astype(_I8),
            self.minute_total.astype(_F8),
            self.minute_sq.astype(_F8),
            self.counts.astype(_I8),
        )
        return zlib.compress(b"".join(p.tobytes() for p in parts), 1)

    @classmethod
    def decode(cls, start: int, blob: bytes) -> Block:
        # every field is 8 bytes wide: one owned int64 copy of the whole blob, the fields are
        # views into it (a cold stats reader decodes ~5k blobs; one copy instead of five)
        words = np.frombuffer(zlib.decompress(blob), dtype=_I8).astype(np.int64)
        span, lo, k = (int(x) for x in words[:3])
        if words.size != 3 + 3 * span + k:
            raise ValueError("a block blob of the wrong length")
        floats = words.view(np.float64)
        return cls(
            start,
            span,
            words[3 : 3 + span],
            floats[3 + span : 3 + 2 * span],
            floats[3 + 2 * span : 3 + 3 * span],
            lo,
            words[3 + 3 * span :],
        )

    @classmethod
    def of_fine(
        cls,
        start: int,
        span: int,
        *,
        minute: IntArray,
        n: IntArray,
        total: FloatArray,
        total_sq: FloatArray,
        bins: IntArray,
        counts: IntArray,
    ) -> Block:
        """A block from fine rollup rows of minutes in it: summaries (minute, n, total, total_sq)
        and the fine bins (bin, count) of those minutes."""
        off = np.asarray(minute, dtype=np.int64) - start
        if off.size and (int(off.min()) < 0 or int(off.max()) >= span):
            raise ValueError("fine rows outside the block")
        c = coarse_bin(np.asarray(bins, dtype=np.int64))
        lo = int(c.min()) if c.size else 0
        dense = np.bincount(c - lo, weights=counts) if c.size else np.zeros(0)
        return cls(
            start,
            span,
            np.bincount(off, weights=n, minlength=span).astype(np.int64),
            np.bincount(off, weights=total, minlength=span).astype(np.float64),
            np.bincount(off, weights=total_sq, minlength=span).astype(np.float64),
            lo,
            np.rint(dense).astype(np.int64),
        )

    @classmethod
    def combine(cls, start: int, span: int, parts: Sequence[Block]) -> Block:
        """The sum of blocks that all lie inside [start, start + span)."""
        n = np.zeros(span, dtype=np.int64)
        total = np.zeros(span, dtype=np.float64)
        sq = np.zeros(span, dtype=np.float64)
        filled = [p for p in parts if p.counts.size]
        lo = min((p.lo for p in filled), default=0)
        hi = max((p.lo + p.counts.size for p in filled), default=0)
        counts = np.zeros(max(hi - lo, 0), dtype=np.int64)
        for p in parts:
            off = p.start - start
            if off < 0 or off + p.span > span:
                raise ValueError("a part lies outside the block")
            n[off : off + p.span] += p.minute_n
            total[off : off + p.span] += p.minute_total
            sq[off : off + p.span] += p.minute_sq
            if p.counts.size:
                counts[p.lo - lo : p.lo - lo + p.counts.size] += p.counts
        return cls(start, span, n, total, sq, lo, counts)
