"""`ReportData`: everything one report shows, gathered from the store by `build.collect`.

A module of its own so that the renderers (`html`) and the builder (`build`) both read it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from specproxy.config import StatsConfig, WarmupConfig
from specproxy.records import EngineSample
from specproxy.stats.result import StatsResult

__all__ = ["FloatArray", "ReportData"]

FloatArray = npt.NDArray[np.float64]


@dataclass(slots=True)
class ReportData:
    """Everything one report shows, gathered from the store (no I/O after this)."""

    run_id: str
    stats: StatsResult | None  # the stats job's last result
    stats_t: float | None
    history: list[tuple[float, StatsResult]]
    latency: dict[str, dict[str, FloatArray]]  # metric -> arm -> values used
    t_start: dict[str, FloatArray]  # arm -> start times of the requests used
    excluded_warmup: dict[str, int]
    excluded_failed: dict[str, int]
    shadows: dict[str, int]
    engine: list[EngineSample]
    settings: StatsConfig
    warmup: WarmupConfig
    span: tuple[float, float] | None
    figures: dict[str, bytes] = field(default_factory=dict)
    load_source: str = ""
    load_bins: list[dict[str, Any]] = field(default_factory=list)  # the result's load bands
    positions: tuple[float, ...] = ()
    recomputed: bool = False  # True when the stats were computed for the report
