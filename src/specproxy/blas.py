"""One BLAS thread per proxy process, so the stats job's matrix products stay on its own core.

numpy's OpenBLAS starts one thread per CPU and spins them while it waits for work. In
`specproxy serve` its matrices are the stats job's (Poisson bootstrap weights times block counts,
a few thousand rows): too small to gain from a second thread, and that thread competes with the
event loop, which serves the requests, for the other core. Measured on this project's 2-core dev
host, `benchmarks/bench_rollups.py --days 30 --rate 1000` (SQLite): a warm 30-day tick took
1.1-1.2 s with one BLAS thread and 1.2-1.3 s with two, but 1.1-1.2 CPU-s instead of 2.0-2.1;
the cold tick 1.6-1.8 s (1.8-2.0 CPU-s) instead of 1.9 s (2.9 CPU-s); a 43k-row tick 2.0 CPU-s
instead of 3.5.

`limit_blas_threads` caps the BLAS libraries already loaded (threadpoolctl) and sets
`OPENBLAS_NUM_THREADS` for any loaded later. A thread count the operator chose wins: any of
`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS` in the environment leaves BLAS alone.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping
from typing import Final

from threadpoolctl import threadpool_limits

__all__ = ["BLAS_THREADS", "OPERATOR_VARIABLES", "limit_blas_threads"]

BLAS_THREADS: Final = 1
OPERATOR_VARIABLES: Final = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def limit_blas_threads(
    threads: int = BLAS_THREADS, environ: MutableMapping[str, str] | None = None
) -> bool:
    """Cap BLAS at `threads` threads; whether it did (False: the operator chose a number)."""
    env = os.environ if environ is None else environ
    if any(name in env for name in OPERATOR_VARIABLES):
        return False
    env["OPENBLAS_NUM_THREADS"] = str(threads)
    threadpool_limits(limits=threads, user_api="blas")
    return True
