"""Fixed glibc malloc thresholds, so a stats tick neither keeps its freed memory nor page-faults
its way through every buffer again.

glibc serves an allocation above `M_MMAP_THRESHOLD` (128 KiB) with its own mmap, which `free`
unmaps at once, and gives the heap's free top back to the OS above `M_TRIM_THRESHOLD` (128 KiB).
By default both are dynamic: freeing an mmapped block raises the mmap threshold to that block's
size (up to 32 MiB) and the trim threshold to twice that, so from then on buffers that size
(numpy's bootstrap work arrays, a tick's columns) come from the heap, where fragmentation keeps
them resident after `free`. A long-running `specproxy serve` ratcheted up one tick's working set
at a time: under the hostile clients of tests/faults/test_hostile_input.py its RSS went from
156 MiB to 298 MiB by the 17,000th request and then stayed there.

Pinning both at glibc's 128 KiB defaults fixed that, but made every buffer above 128 KiB a fresh
mapping, faulted in 4 KiB page by page on every tick: a 30-day rollup tick took ~355,000 page
faults, and in `benchmarks/bench_rollups.py --days 30 --rate 1000` a warm tick took 2.4-2.6 s
instead of 1.2-1.4 s (this project's dev host is a Firecracker VM, where a fault is dear). So
the thresholds are pinned higher, and fixed:
  * mmap at `MMAP_THRESHOLD_BYTES` (2 MiB): smaller buffers are reused from the heap; larger
    ones are mapped and unmapped (numpy asks for transparent huge pages from 4 MiB on, so those
    fault in 2 MiB at a time where the kernel allows it);
  * trim at `TRIM_THRESHOLD_BYTES` (32 MiB): a tick's freed heap top is kept for the next tick up
    to that much per arena, and returned beyond it.
Measured: the 30-day ticks above at 1.2-1.4 s warm and 1.8-2.4 s cold on SQLite (128 KiB pins:
2.4-2.6 s and 3.1-3.6 s); the hostile-input test's proxy at 124 MiB before, 153 MiB halfway
and 160 MiB after its 10,000 requests.
glibc's mallopt(3) documents both parameters and the dynamic adjustment.

A threshold the operator chose wins: `MALLOC_MMAP_THRESHOLD_` or `MALLOC_TRIM_THRESHOLD_` in the
environment, or `glibc.malloc.mmap_threshold` / `glibc.malloc.trim_threshold` in
`GLIBC_TUNABLES`, leaves both alone. Off glibc (musl, macOS) nothing happens.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "pin_malloc_thresholds"]

M_TRIM_THRESHOLD = -1  # <malloc.h>
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 2 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 32 * 1024 * 1024


def _operator_chose(environ: Mapping[str, str]) -> bool:
    tunables = environ.get("GLIBC_TUNABLES", "")
    return (
        "MALLOC_MMAP_THRESHOLD_" in environ
        or "MALLOC_TRIM_THRESHOLD_" in environ
        or "mmap_threshold" in tunables
        or "trim_threshold" in tunables
    )


def pin_malloc_thresholds(
    mmap_bytes: int = MMAP_THRESHOLD_BYTES,
    trim_bytes: int = TRIM_THRESHOLD_BYTES,
    environ: Mapping[str, str] | None = None,
) -> bool:
    """Fix glibc's mmap and trim thresholds; whether they were set (False: not glibc, or the
    operator set one already)."""
    if _operator_chose(os.environ if environ is None else environ):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # not glibc (musl's mallopt accepts the call and ignores it)
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_bytes)) and bool(
        libc.mallopt(M_TRIM_THRESHOLD, trim_bytes)
    )
