"""The default recorder: a bounded in-memory ring, used until a `Store` is plugged in.

It satisfies the `Recorder` protocol (never blocks, never raises) so the proxy can run with no
store at all, e.g. in tests and benchmarks, and `ReadBarrier`: reading `records` first settles
the calls the proxy has finished but not yet recorded (`proxy.backlog`). Old rows fall off the
ring; a real deployment replaces it with a store that persists every row. The ring is kept
small: every record is a GC-tracked object, and a 100k ring measurably slowed the proxy (full
collections scan it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from specproxy.records import EngineSample, RequestRecord

__all__ = ["MemoryRecorder"]


class MemoryRecorder:
    """Keeps the latest `maxlen` request records and engine samples."""

    def __init__(self, maxlen: int = 10_000) -> None:
        self._records: deque[RequestRecord] = deque(maxlen=maxlen)
        self.engine_samples: deque[EngineSample] = deque(maxlen=maxlen)
        self._settle: Callable[[], None] | None = None

    @property
    def records(self) -> deque[RequestRecord]:
        """The latest records, every call already over included."""
        if self._settle is not None:
            self._settle()
        return self._records

    def before_reads(self, settle: Callable[[], None]) -> None:
        self._settle = settle

    def record(self, rec: RequestRecord) -> None:
        self._records.append(rec)

    def record_engine(self, sample: EngineSample) -> None:
        self.engine_samples.append(sample)
