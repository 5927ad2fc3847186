"""`malloc.pin_mmap_threshold`, observed through glibc's own accounting (mallinfo2's `hblkhd`:
bytes held in mmapped blocks) in a fresh interpreter per case."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from specproxy.malloc import pin_mmap_threshold

# Allocates and frees a 1 MiB block, then allocates another one and prints whether it was
# mmapped. glibc's dynamic threshold rises to 1 MiB at the first free, so without a pinned
# threshold the second block comes from the heap.
_PROBE = """
import ctypes, sys
from specproxy.malloc import pin_mmap_threshold
class Mallinfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in (
        "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost").split()]
libc = ctypes.CDLL(None)
libc.mallinfo2.restype = Mallinfo2
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = (ctypes.c_void_p,)
pinned = pin_mmap_threshold() if sys.argv[1] == "pin" else False
size = 1 << 20
libc.free(libc.malloc(size))
before = libc.mallinfo2().hblkhd
block = libc.malloc(size)
print(pinned, libc.mallinfo2().hblkhd - before >= size)
libc.free(block)
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
    assert _probe("default") == "False False"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc behaviour")
def test_pinned_threshold_keeps_large_blocks_mmapped() -> None:
    assert _probe("pin") == "True True"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc behaviour")
def test_operator_threshold_wins() -> None:
    assert _probe("pin", MALLOC_MMAP_THRESHOLD_="4194304") == "False False"
    tunables = "glibc.malloc.mmap_threshold=4194304"
    assert _probe("pin", GLIBC_TUNABLES=tunables) == "False False"


def test_environment_settings_are_respected_without_calling_glibc() -> None:
    assert pin_mmap_threshold(environ={"MALLOC_MMAP_THRESHOLD_": "65536"}) is False
    assert pin_mmap_threshold(environ={"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=1"}) is False
