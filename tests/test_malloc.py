"""`malloc.pin_malloc_thresholds`, observed through glibc's own accounting (mallinfo2's `hblkhd`:
bytes held in mmapped blocks; `keepcost`: the releasable free top of the heap) in a fresh
interpreter per case."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specproxy.malloc import MMAP_THRESHOLD_BYTES, TRIM_THRESHOLD_BYTES, pin_malloc_thresholds

# argv: mode (default | pin | pin-low-trim). Allocates and frees a block above the pinned mmap
# threshold, then allocates another and prints whether it was mmapped: glibc's dynamic threshold
# rises to that size at the first free, so without a pin the second block comes from the heap.
# Then frees a heap block below the mmap threshold at the top of the heap and prints whether
# glibc kept it (keepcost): above the default 128 KiB trim threshold it is given back.
_PROBE = """
import ctypes, sys
from specproxy.malloc import MMAP_THRESHOLD_BYTES, pin_malloc_thresholds
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost").split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
mode = sys.argv[1]
pinned = False
if mode == "pin":
    pinned = pin_malloc_thresholds()
elif mode == "pin-low-trim":
    pinned = pin_malloc_thresholds(trim_bytes=128 * 1024)
big = 2 * MMAP_THRESHOLD_BYTES
libc.free(libc.malloc(big))
before = libc.mallinfo2().hblkhd
block = libc.malloc(big)
mapped = libc.mallinfo2().hblkhd - before >= big
libc.free(block)
heap = MMAP_THRESHOLD_BYTES * 3 // 4
if mode != "default":
    libc.free(libc.malloc(heap))
    kept = libc.mallinfo2().keepcost >= heap
else:
    kept = None
print(pinned, mapped, kept)
"""


def _probe(mode: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_"))}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, mode],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout.strip()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc behaviour")
def test_default_glibc_moves_a_freed_block_size_to_the_heap() -> None:
    """The behaviour the module exists for (so the next test cannot pass vacuously)."""
    assert _probe("default") == "False False None"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc behaviour")
def test_pinned_thresholds_keep_large_blocks_mmapped_and_a_freed_heap_top() -> None:
    assert _probe("pin") == "True True True"
    # the control: the same heap block is trimmed at glibc's default trim threshold
    assert _probe("pin-low-trim") == "True True False"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc behaviour")
def test_operator_threshold_wins() -> None:
    for env in (
        {"MALLOC_MMAP_THRESHOLD_": "4194304"},
        {"MALLOC_TRIM_THRESHOLD_": "4194304"},
        {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4194304"},
        {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=4194304"},
    ):
        assert _probe("pin", **env).startswith("False"), env


def test_environment_settings_are_respected_without_calling_glibc() -> None:
    assert pin_malloc_thresholds(environ={"MALLOC_MMAP_THRESHOLD_": "65536"}) is False
    assert pin_malloc_thresholds(environ={"MALLOC_TRIM_THRESHOLD_": "65536"}) is False
    tunables = {"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"}
    assert pin_malloc_thresholds(environ=tunables) is False
    assert MMAP_THRESHOLD_BYTES < TRIM_THRESHOLD_BYTES
