"""`blas.limit_blas_threads`, observed through threadpoolctl in a fresh interpreter per case."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from specproxy.blas import OPERATOR_VARIABLES, limit_blas_threads

_PROBE = """
import json, os, sys
import numpy
from threadpoolctl import threadpool_info
from specproxy.blas import limit_blas_threads
before = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
limited = limit_blas_threads()
after = [i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"]
print(json.dumps([limited, before, after, os.environ.get("OPENBLAS_NUM_THREADS")]))
"""


def _probe(**env: str) -> list[object]:
    environ = {k: v for k, v in os.environ.items() if k not in OPERATOR_VARIABLES}
    out = subprocess.run(
        [sys.executable, "-c", _PROBE],
        env={**environ, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    result: list[object] = json.loads(out.stdout)
    return result


def test_blas_gets_one_thread_now_and_for_libraries_loaded_later() -> None:
    limited, before, after, variable = _probe()
    assert limited is True and variable == "1"
    assert isinstance(before, list) and isinstance(after, list) and after
    assert set(after) == {1}
    if (os.cpu_count() or 1) > 1:  # the default the module exists to change
        assert max(before) > 1


def test_a_thread_count_the_operator_chose_wins() -> None:
    limited, before, after, variable = _probe(OMP_NUM_THREADS="2")
    assert limited is False and before == after and variable is None
    env: dict[str, str] = {"OPENBLAS_NUM_THREADS": "3"}
    assert limit_blas_threads(environ=env) is False and env == {"OPENBLAS_NUM_THREADS": "3"}
