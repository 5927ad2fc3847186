"""The default recorder: a bounded in-memory ring, used until a `Store` is plugged in.

It satisfies the `Recorder` protocol (never blocks, never raises) so the proxy can run with no
store at all, e.g. in tests and benchmarks. Old rows fall off the ring; a real deployment
replaces it with a store that persists every row. The ring is kept small: every record is a
GC-tracked object, and a 100k ring measurably slowed the proxy (full collections scan it).
"""

from __future__ import annotations

from collections import deque

from specproxy.records import EngineSample, RequestRecord

__all__ = ["MemoryRecorder"]


class MemoryRecorder:
    """Keeps the latest `maxlen` request records and engine samples."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self.records: deque[RequestRecord] = deque(maxlen=maxlen)
        self.engine_samples: deque[EngineSample] = deque(maxlen=maxlen)

    def record(self, rec: RequestRecord) -> None:
        self.records.append(rec)

    def record_engine(self, sample: EngineSample) -> None:
        self.engine_samples.append(sample)
