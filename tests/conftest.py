"""Shared test fixtures: the real-vLLM fixture files and a guard for required system binaries."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property tests must not depend on the machine's speed or on earlier runs: no per-example
# deadline, no "too slow" health check, a fixed example sequence, no example database on disk.
settings.register_profile(
    "specproxy",
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("specproxy")

FIXTURES = Path(__file__).parent / "fixtures" / "vllm-0.32.0-cpu"


def fixture_path(name: str) -> Path:
    """Path of a verbatim file captured from real vLLM 0.32.0 (see its README)."""
    return FIXTURES / name


def require_binary(name: str, *candidates: str) -> str:
    """Return the path of a system binary; in CI a missing one fails the test, never skips it."""
    for candidate in (name, *candidates):
        found = shutil.which(candidate) or (candidate if os.path.exists(candidate) else None)
        if found:
            return found
    message = f"{name} is not installed (run `make sysdeps`)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)
