"""A fixed glibc mmap threshold, so the memory a stats tick frees goes back to the OS.

glibc serves an allocation above `M_MMAP_THRESHOLD` (128 KiB) with its own mmap, which `free`
unmaps at once. But by default the threshold is dynamic: freeing such a block raises it to that
block's size (up to 32 MiB), so from then on buffers that size (numpy's bootstrap work arrays,
a tick's columns) come from the heap, where fragmentation keeps them resident after `free`. A
long-running `specproxy serve` ratcheted up one tick's working set at a time. Under the hostile
clients of tests/faults/test_hostile_input.py its RSS went from 156 MiB to 298 MiB by the 17,000th
request and then stayed there; with the threshold fixed (`mallopt` turns the dynamic adjustment
off) it went from 148 MiB to 168 MiB over 19,000, and repeated ticks on one store took as long.
glibc's mallopt(3) documents M_MMAP_THRESHOLD and the dynamic adjustment.

A threshold the operator chose wins: `MALLOC_MMAP_THRESHOLD_` in the environment or
`glibc.malloc.mmap_threshold` in `GLIBC_TUNABLES` leaves it alone. Off glibc (musl, macOS)
nothing happens.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping

__all__ = ["MMAP_THRESHOLD_BYTES", "pin_mmap_threshold"]

M_MMAP_THRESHOLD = -3  # <malloc.h>
MMAP_THRESHOLD_BYTES = 128 * 1024  # glibc's own default, made fixed


def pin_mmap_threshold(
    nbytes: int = MMAP_THRESHOLD_BYTES, environ: Mapping[str, str] | None = None
) -> bool:
    """Fix glibc's mmap threshold at `nbytes`; whether it was set (False: not glibc, or the
    operator set it already)."""
    environ = os.environ if environ is None else environ
    if "MALLOC_MMAP_THRESHOLD_" in environ or "mmap_threshold" in environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False  # not glibc (musl's mallopt accepts the call and ignores it)
    libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    libc.mallopt.restype = ctypes.c_int
    return bool(libc.mallopt(M_MMAP_THRESHOLD, nbytes))
