"""The job tests' store: the shared run (`runs`) in a memory store."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from specproxy.config import StoreConfig
from specproxy.errors import ErrorKind
from specproxy.records import EngineSample, RequestRecord
from specproxy.store.memory import MemoryStore
from tests.stats.job.runs import RUN, records, typo_404


@pytest.fixture
async def store() -> AsyncIterator[MemoryStore]:
    s = MemoryStore(StoreConfig(url="memory://"), run_id=RUN)
    await s.start()
    for rec in records(1600, 1000.0, 1.5, 0):
        s.record(rec)
    s.record(
        RequestRecord(
            "bad",
            RUN,
            "baseline",
            1001.0,
            "m-a",
            "completions",
            False,
            502,
            0.1,
            0.1,
            error_kind=ErrorKind.HTTP_5XX,
        )
    )
    # A request for a model nobody serves: recorded (404), but no model of the result.
    s.record(typo_404())
    s.record_engine(
        EngineSample(
            1000.0,
            RUN,
            "speculative",
            True,
            acceptance_rate=0.8,
            mean_acceptance_length=3.0,
            position_acceptance=(0.9, 0.8, 0.7),
        )
    )
    s.record_engine(EngineSample(1040.0, RUN, "speculative", True))
    s.record_engine(EngineSample(1050.0, RUN, "speculative", True, restarted=True))
    await s.flush()
    yield s
    await s.close()
