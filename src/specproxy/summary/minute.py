"""Per-minute mergeable rollups: the unit the statistics work on when a window is too big for rows.

A leaf shared by the store (which writes rollups with the rows) and the statistics (which read
them); it depends on nothing but the records and the grid.

For every (run, minute, model, arm, metric) a rollup holds
  * a summary: count n, sum, sum of squares (exact; the mean and its block replicates use them);
  * a sparse histogram on the fixed grid of `loggrid.py` (bins 0.02 % wide, the Poisson path's
    width, so the documented bound `GRID_ERROR_BOUND` holds for quantiles from rollups).
Both are sums over requests, so rollups merge by addition: every replica upserts the rollups of
the rows it flushes with `count = count + excluded.count`, in the same transaction as the rows,
and any number of replicas, batches or retries add up to the rollup of all rows (a batch is
written once: the store retries a failed transaction as a whole).

What is rolled up: primary (non-shadow) requests that are usable for the statistics (HTTP 200, no
error kind, client still connected) with a finite positive metric value, exactly the rows the
split-design comparison uses. Minute = floor(t_start / 60).

The `model` of a rollup key is the bounded label (`fleet.models.ModelLabels.label`: a served or
allowed model, else "other"), not the client's string: a key per distinct string would let a
client who sends a new `model` with every request make the rollups grow like the rows (3 summary
rows per request, measured: 20,000 requests with distinct strings wrote 60,000 summary rows
instead of 24), and with them every stats tick. The store passes its labeller in
(`Store.label_models`); the raw string stays on the request row.

The length adjustment's regression (`stats.adjust`) is rolled up as its sufficient statistics:
per (run, minute, model, arm), over the same requests when they report both token counts, the
count and the sums of u, v, u^2, v^2, uv, y, uy, vy, y^2 with y = log E2E, u = log output tokens,
v = log prompt tokens (`MOMENT_SUMS`; schema v8, `store.moments`). Its fully interacted OLS is
one 3x3 solve per arm from those sums, so a window (or a bootstrap block) of minutes gives the
same estimate as its rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproxy.records import RequestRecord
from specproxy.summary.grid import grid_histogram

__all__ = [
    "MOMENT_SUMS",
    "ROLLUP_METRICS",
    "ROLLUP_UNIT_S",
    "BinRow",
    "MomentRow",
    "RollupBatch",
    "SummaryRow",
    "as_is",
    "merge_batches",
    "minute_of",
    "moment_values",
    "rollup_records",
    "usable_for_rollup",
]

FloatArray = npt.NDArray[np.float64]
ROLLUP_UNIT_S: Final = 60.0  # one minute: the rollups' (and the block bootstrap's) time unit
# metric name -> record attribute (the same names as `compare.METRIC_COLUMNS`)
ROLLUP_METRICS: Final[dict[str, str]] = {
    "e2e": "e2e_s",
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "step": "mean_gap_s",  # streamed requests' mean gap between content events: one engine step
}

# (run_id, minute, model, arm, metric, n, sum, sum_sq)
SummaryRow = tuple[str, int, str, str, str, int, float, float]
# (run_id, minute, model, arm, metric, bin, count)
BinRow = tuple[str, int, str, str, str, int, int]
# The regression's sufficient statistics, in this order (n, then sums; see the module docstring).
MOMENT_SUMS: Final = ("n", "su", "sv", "suu", "svv", "suv", "sy", "suy", "svy", "syy")
# (run_id, minute, model, arm, *MOMENT_SUMS)
MomentRow = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class RollupBatch:
    """Additive rollup rows of a batch of records."""

    summaries: list[SummaryRow]
    bins: list[BinRow]
    moments: list[MomentRow] = field(default_factory=list)


def moment_values(e2e: FloatArray, output: FloatArray, prompt: FloatArray) -> FloatArray:
    """`MOMENT_SUMS` of requests with these E2E latencies and token counts (all positive)."""
    y, u, v = np.log(e2e), np.log(output), np.log(prompt)
    return np.array(
        [y.size, u.sum(), v.sum(), u @ u, v @ v, u @ v, y.sum(), u @ y, v @ y, y @ y],
        dtype=np.float64,
    )


def minute_of(t: float) -> int:
    return math.floor(t / ROLLUP_UNIT_S)


def usable_for_rollup(rec: RequestRecord) -> bool:
    return rec.status == 200 and rec.error_kind is None and not rec.disconnected and not rec.shadow


def as_is(model: str) -> str:
    """The labeller of a store nobody bounded (tests, offline tools writing known models)."""
    return model


def rollup_records(
    records: Iterable[RequestRecord], model_label: Callable[[str], str] = as_is
) -> RollupBatch:
    """The rollup rows of `records` (one summary per key, one row per occupied bin), keyed by
    `model_label(record.model)`."""
    groups: dict[tuple[str, int, str, str, str], list[float]] = {}
    covariates: dict[tuple[str, int, str, str], list[tuple[float, float, float]]] = {}
    labels: dict[str, str] = {}
    for rec in records:
        if not usable_for_rollup(rec):
            continue
        minute = minute_of(rec.t_start)
        model = labels.get(rec.model)
        if model is None:
            model = labels[rec.model] = model_label(rec.model)
        if _regressable(rec):
            covariates.setdefault((rec.run_id, minute, model, rec.arm.value), []).append(
                (rec.e2e_s, float(rec.output_tokens or 0), float(rec.prompt_tokens or 0))
            )
        for metric, attr in ROLLUP_METRICS.items():
            value = getattr(rec, attr)
            if value is None or not math.isfinite(value) or value <= 0:
                continue
            key = (rec.run_id, minute, model, rec.arm.value, metric)
            groups.setdefault(key, []).append(float(value))
    summaries: list[SummaryRow] = []
    bins: list[BinRow] = []
    for key, values in groups.items():
        v = np.asarray(values, dtype=np.float64)
        summaries.append((*key, int(v.size), float(v.sum()), float(v @ v)))
        b, c = grid_histogram(v)
        bins.extend((*key, int(i), int(n)) for i, n in zip(b, c, strict=True))
    moments: list[MomentRow] = []
    for mkey, rows in covariates.items():
        e2e, output, prompt = np.asarray(rows, dtype=np.float64).T
        sums = moment_values(e2e, output, prompt)
        moments.append((*mkey, int(sums[0]), *(float(x) for x in sums[1:])))
    return RollupBatch(summaries, bins, moments)


def _regressable(rec: RequestRecord) -> bool:
    """A request the length adjustment can use: finite positive E2E and both token counts."""
    return (
        math.isfinite(rec.e2e_s)
        and rec.e2e_s > 0
        and rec.output_tokens is not None
        and rec.output_tokens > 0
        and rec.prompt_tokens is not None
        and rec.prompt_tokens > 0
    )


def merge_batches(batches: Sequence[RollupBatch]) -> RollupBatch:
    """Add rollup rows with equal keys (what the stores' additive upserts do)."""
    summaries: dict[tuple[str, int, str, str, str], list[float]] = {}
    bins: dict[tuple[str, int, str, str, str, int], int] = {}
    for batch in batches:
        for run_id, minute, model, arm, metric, n, total, total_sq in batch.summaries:
            acc = summaries.setdefault((run_id, minute, model, arm, metric), [0, 0.0, 0.0])
            acc[0] += n
            acc[1] += total
            acc[2] += total_sq
        for run_id, minute, model, arm, metric, b, count in batch.bins:
            k = (run_id, minute, model, arm, metric, b)
            bins[k] = bins.get(k, 0) + count
    moments: dict[tuple[Any, ...], FloatArray] = {}
    for batch in batches:
        for row in batch.moments:
            key, values = row[:4], np.asarray(row[4:], dtype=np.float64)
            moments[key] = moments[key] + values if key in moments else values
    return RollupBatch(
        [(*k, int(v[0]), float(v[1]), float(v[2])) for k, v in summaries.items()],
        [(*k, c) for k, c in bins.items()],
        [(*k, int(v[0]), *(float(x) for x in v[1:])) for k, v in moments.items()],
    )
