"""The store contract shared by the proxy (writer), the scraper (writer) and the stats job (reader).

Backends (`memory://`, `sqlite:///path`, `postgresql://...`) implement `Store`. Writes go through
the non-blocking `Recorder` half (`record`, `record_engine`): the backend batches them and flushes
at least every `store.flush_interval_s`. Reads return numpy arrays per arm, because the statistics
work on columns, never on Python objects.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from specproxy.records import Arm, EngineSample, RequestRecord

__all__ = ["ArmArrays", "Store"]

# column name -> values, one entry per record, in t_start order. Numeric columns are float64
# (None -> NaN), booleans are bool arrays, strings (model, pair_id, ...) are object arrays.
ArmArrays = dict[str, npt.NDArray[Any]]


class Store(Protocol):
    """What every backend provides. All methods are safe to call from the event loop."""

    async def start(self) -> None:
        """Open connections, run migrations, start the background flusher, replay any spill."""

    async def close(self) -> None:
        """Flush everything still buffered (SIGTERM path), then release resources."""

    def record(self, rec: RequestRecord) -> None:
        """Queue a request record; never blocks, never raises."""

    def record_engine(self, sample: EngineSample) -> None:
        """Queue an engine sample; never blocks, never raises."""

    async def flush(self) -> None:
        """Write everything queued so far (tests and shutdown)."""

    async def read_arrays(
        self,
        *,
        run_id: str,
        columns: Sequence[str],
        since: float | None = None,
        until: float | None = None,
        model: str | None = None,
        include_shadow: bool = True,
    ) -> dict[Arm, ArmArrays]:
        """Records of `run_id` with since <= t_start < until, per arm, as column arrays."""
        ...

    async def read_engine_samples(
        self, *, run_id: str, since: float | None = None, arm: Arm | None = None
    ) -> list[EngineSample]:
        """Engine samples in time order (restart markers included)."""
        ...

    async def write_stats(self, *, run_id: str, t: float, result: dict[str, Any]) -> None:
        """Append one stats-job result (JSON-able) to the history."""

    async def read_stats_history(
        self, *, run_id: str, since: float | None = None
    ) -> list[tuple[float, dict[str, Any]]]:
        """Stats-job results in time order, for reports."""
        ...

    async def models(self, *, run_id: str) -> list[str]:
        """Distinct models seen in a run."""
        ...

    async def run_ids(self) -> list[str]:
        """Distinct run ids in the store."""
        ...

    @property
    def pending(self) -> int:
        """Rows queued but not yet durable (the `specproxy_store_pending` gauge)."""
        ...

    @property
    def dropped(self) -> int:
        """Rows lost for good; must stay 0 (`specproxy_store_dropped_total`)."""
        ...


def np_float(values: Sequence[float | None]) -> npt.NDArray[np.float64]:
    """Floats with None mapped to NaN."""
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)
