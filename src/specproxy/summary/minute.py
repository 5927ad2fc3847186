"""Per-minute mergeable rollups of records: what the statistics use for windows too big for rows.

Per (run, metric, minute, model, arm): a summary (n, sum, sum of squares) and a sparse histogram on
the fixed grid (`summary.grid`); per (run, minute, model, arm): the length adjustment's sufficient
statistics (`MOMENT_SUMS`: n and the sums of u, v, u^2, v^2, uv, y, uy, vy, y^2 with y = log E2E,
u = log output tokens, v = log prompt tokens). All are sums over requests, so the rollups of any
replicas, batches and retries add up (`store.aggregates`). Rolled up: primary requests usable for
the statistics (HTTP 200, no error kind, client connected, not rerouted: `RequestRecord.comparable`)
with a finite positive value; minute = floor(t_start / 60); the model is the store's bounded label
(`Sink.label_models`), so a client naming a new model per request cannot make the rollups grow
like the rows. The same requests' E2E and TPOT are rolled up again per condition they met
(`summary.conditions`: metrics `CONDITION_METRICS`, keyed "load=7", "category=code", ...,
coarse bins), the summaries the speedups by condition read. Pure Python (it runs on the
proxy's write path); its sums are numpy's, bit for bit (`pairwise_sum`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from specproxy.records import RequestRecord
from specproxy.summary.conditions import CONDITION_METRICS, condition_keys
from specproxy.summary.grid import bin_of, coarse_centre_of

__all__ = [
    "MOMENT_SUMS",
    "ROLLUP_METRICS",
    "ROLLUP_UNIT_S",
    "STORED_METRICS",
    "BinRow",
    "MomentRow",
    "RollupBatch",
    "SummaryRow",
    "as_is",
    "minute_of",
    "moment_values",
    "pairwise_sum",
    "rollup_records",
    "usable_for_rollup",
]

ROLLUP_UNIT_S: Final = 60.0  # one minute: the rollups' (and the block bootstrap's) time unit
# metric name -> record attribute (the same names as `compare.METRIC_COLUMNS`)
ROLLUP_METRICS: Final[dict[str, str]] = {
    "e2e": "e2e_s",
    "ttft": "ttft_s",
    "tpot": "tpot_s",
    "step": "mean_gap_s",  # streamed requests' mean gap between content events: one engine step
}

# every metric the rollup tables hold: the compared ones, keyed by model, and the conditions'
# keyed by condition (`summary.conditions`: the same tables, coarse bins)
STORED_METRICS: Final = (*ROLLUP_METRICS, *CONDITION_METRICS)

# Rows are in their table's column order, the primary key first (`store.aggregates`).
# (run_id, metric, minute, model, arm, n, sum, sum_sq)
SummaryRow = tuple[str, str, int, str, str, int, float, float]
# (run_id, metric, minute, model, arm, bin, count)
BinRow = tuple[str, str, int, str, str, int, int]
# The regression's sufficient statistics, in this order (n, then sums; see the module docstring).
MOMENT_SUMS: Final = ("n", "su", "sv", "suu", "svv", "suv", "sy", "suy", "svy", "syy")
# (run_id, minute, model, arm, *MOMENT_SUMS)
MomentRow = tuple[Any, ...]

_PAIRWISE_BLOCK: Final = 128  # numpy's PW_BLOCKSIZE


@dataclass(frozen=True, slots=True)
class RollupBatch:
    """Additive rollup rows of a batch of records."""

    summaries: list[SummaryRow]
    bins: list[BinRow]
    moments: list[MomentRow] = field(default_factory=list)


def pairwise_sum(values: Sequence[float]) -> float:
    """The sum of `values` in numpy's order (`np.add.reduce` of a float64 array), so it is bit
    for bit what `np.sum` gives."""
    return _pairwise(values, 0, len(values)) if values else 0.0


def _pairwise(v: Sequence[float], lo: int, n: int) -> float:
    if n < 8:
        res = -0.0
        for i in range(lo, lo + n):
            res += v[i]
        return res
    if n <= _PAIRWISE_BLOCK:
        r0, r1, r2, r3, r4, r5, r6, r7 = v[lo : lo + 8]
        end = lo + n - n % 8
        for i in range(lo + 8, end, 8):
            r0 += v[i]
            r1 += v[i + 1]
            r2 += v[i + 2]
            r3 += v[i + 3]
            r4 += v[i + 4]
            r5 += v[i + 5]
            r6 += v[i + 6]
            r7 += v[i + 7]
        res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
        for i in range(end, lo + n):
            res += v[i]
        return res
    half = n // 2
    half -= half % 8
    return _pairwise(v, lo, half) + _pairwise(v, lo + half, n - half)


def moment_values(
    e2e: Iterable[float], output: Iterable[float], prompt: Iterable[float]
) -> tuple[float, ...]:
    """`MOMENT_SUMS` of requests with these E2E latencies and token counts (all positive)."""
    y = [math.log(x) for x in e2e]
    u = [math.log(x) for x in output]
    v = [math.log(x) for x in prompt]

    def dot(a: list[float], b: list[float]) -> float:
        return pairwise_sum([p * q for p, q in zip(a, b, strict=True)])

    return (
        float(len(y)),
        pairwise_sum(u),
        pairwise_sum(v),
        dot(u, u),
        dot(v, v),
        dot(u, v),
        pairwise_sum(y),
        dot(u, y),
        dot(v, y),
        dot(y, y),
    )


def minute_of(t: float) -> int:
    return math.floor(t / ROLLUP_UNIT_S)


def usable_for_rollup(rec: RequestRecord) -> bool:
    return rec.comparable and not rec.shadow


def as_is(model: str) -> str:
    """The labeller of a store nobody bounded (tests, offline tools writing known models)."""
    return model


def rollup_records(
    records: Iterable[RequestRecord], model_label: Callable[[str], str] = as_is
) -> RollupBatch:
    """The rollup rows of `records` (one summary per key, one row per occupied bin in bin
    order), keyed by `model_label(record.model)`, and of their conditions (`CONDITION_METRICS`,
    keyed by `summary.conditions.condition_keys`, on the coarse grid)."""
    groups: dict[tuple[str, str, int, str, str], list[float]] = {}
    # (run, condition metric, minute, arm) -> key -> (values, their coarse bins' counts)
    cond_groups: dict[tuple[str, str, int, str], dict[str, tuple[list[float], dict[int, int]]]] = {}
    covariates: dict[tuple[str, int, str, str], list[tuple[float, float, float]]] = {}
    labels: dict[str, str] = {}
    for rec in records:
        if not usable_for_rollup(rec):
            continue
        minute = minute_of(rec.t_start)
        model = labels.get(rec.model)
        if model is None:
            model = labels[rec.model] = model_label(rec.model)
        arm = rec.arm
        if _regressable(rec):
            covariates.setdefault((rec.run_id, minute, model, arm), []).append(
                (rec.e2e_s, float(rec.output_tokens or 0), float(rec.prompt_tokens or 0))
            )
        for metric, attr in ROLLUP_METRICS.items():
            value = getattr(rec, attr)
            if value is None or not math.isfinite(value) or value <= 0:
                continue
            groups.setdefault((rec.run_id, metric, minute, model, arm), []).append(float(value))
        keys: list[str] | None = None
        for metric, (_compared, attr) in CONDITION_METRICS.items():
            value = getattr(rec, attr)
            if value is None or not math.isfinite(value) or value <= 0:
                continue
            if keys is None:
                keys = condition_keys(
                    rec.endpoint_in_flight,
                    rec.prompt_tokens,
                    rec.output_tokens,
                    rec.temperature,
                    rec.category,
                )
            x = float(value)
            b = coarse_centre_of(x)  # once: the value is in a group per condition
            per_key = cond_groups.setdefault((rec.run_id, metric, minute, arm), {})
            for cond in keys:
                entry = per_key.get(cond)
                if entry is None:
                    entry = per_key[cond] = ([], {})
                entry[0].append(x)
                entry[1][b] = entry[1].get(b, 0) + 1
    summaries: list[SummaryRow] = []
    bins: list[BinRow] = []
    for key, values in groups.items():
        hist: dict[int, int] = {}
        for x in values:
            b = bin_of(x)
            hist[b] = hist.get(b, 0) + 1
        _add_group(key, values, hist, summaries, bins)
    for (run_id, metric, minute, arm), per_key in cond_groups.items():
        for cond, (values, hist) in per_key.items():
            _add_group((run_id, metric, minute, cond, arm), values, hist, summaries, bins)
    moments: list[MomentRow] = []
    for mkey, rows in covariates.items():
        e2e, output, prompt = zip(*rows, strict=True)
        sums = moment_values(e2e, output, prompt)
        moments.append((*mkey, int(sums[0]), *sums[1:]))
    return RollupBatch(summaries, bins, moments)


def _add_group(
    key: tuple[str, str, int, str, str],
    values: list[float],
    hist: dict[int, int],
    summaries: list[SummaryRow],
    bins: list[BinRow],
) -> None:
    """A group's summary row and its bin rows in bin order."""
    squares = [x * x for x in values]
    summaries.append((*key, len(values), pairwise_sum(values), pairwise_sum(squares)))
    bins.extend((*key, b, hist[b]) for b in sorted(hist))


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
