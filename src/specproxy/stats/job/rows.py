"""A small run from its rows: the same summaries at a finer time unit, and the mirrored pairs.

Below `ROWS_MAX` usable requests per arm the job reads the run's rows instead of its stored
summaries, for two things the minute summaries cannot give: time units shorter than a minute (a
short run still has enough blocks to resample) and mirrored pairs (they need request ids). The
rows become `frame.Tiers` through the writer's binning, so every statistic is computed as from
the store. The unit divides a minute, so units never straddle a minute (the exceedance test
counts minutes).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from specproxy.records import SHORTHAND_CONTROL, SHORTHAND_TREATMENT, Arm
from specproxy.stats.estimate.crossover import LoadSample
from specproxy.stats.job.cache import ArmTier, FineMinute
from specproxy.stats.job.frame import Tiers, WindowPlan
from specproxy.stats.sample import Pairs
from specproxy.summary.condition_arrays import dimension_keys
from specproxy.summary.conditions import CONDITION_METRICS, DIMENSIONS
from specproxy.summary.histogram import bin_index, coarse_as_fine, coarse_bin
from specproxy.summary.minute import ROLLUP_METRICS

__all__ = ["ROWS_MAX", "ROW_COLUMNS", "ROW_READ", "Rows", "known_label", "row_unit", "usable_mask"]

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
RowArrays = Mapping[str, npt.NDArray[Any]]

# Usable requests on the larger arm up to which the job reads rows (a run above it: summaries).
ROWS_MAX: Final = 100_000
ROW_COLUMNS: Final = (
    "t_start",
    "model",
    "shadow",
    "pair_id",
    *ROLLUP_METRICS.values(),
    "prompt_tokens",
    "output_tokens",
    "endpoint_in_flight",  # the conditions (`stats.segments`)
    "temperature",
    "category",
)
# Units a row window may take: divisors of a minute, so units nest in minutes.
_UNITS_S: Final = (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 10.0, 12.0, 15.0, 20.0, 30.0, 60.0)
_UNITS_PER_WINDOW: Final = 200
# usable ones are kept (`usable_mask`)
ROW_READ: Final = (*ROW_COLUMNS, "status", "error_kind", "disconnected", "rerouted_from")


def row_unit(span_s: float) -> float:
    """The time unit for rows spanning `span_s` seconds: about span / 200, at least a second,
    at most a minute, a divisor of a minute."""
    target = span_s / _UNITS_PER_WINDOW
    return max([u for u in _UNITS_S if u <= target], default=_UNITS_S[0])


def usable_mask(arrays: RowArrays) -> npt.NDArray[np.bool_]:
    """Successful, complete requests: HTTP 200, no error kind, client still connected, not
    rerouted (a treatment's request the control answered while the treatment was down)."""
    n = len(arrays["t_start"])
    ok = np.ones(n, dtype=bool)
    if "status" in arrays:
        ok &= np.asarray(arrays["status"], dtype=np.float64) == 200
    if "error_kind" in arrays:
        ok &= np.array([e is None for e in arrays["error_kind"]], dtype=bool)
    if "disconnected" in arrays:
        ok &= ~np.asarray(arrays["disconnected"], dtype=bool)
    if "rerouted_from" in arrays:
        ok &= np.array([r is None for r in arrays["rerouted_from"]], dtype=bool)
    return ok


@dataclass(frozen=True, slots=True)
class Rows:
    """A run's usable rows per arm (primary and shadow), as column arrays (`ROW_COLUMNS`)."""

    arrays: Mapping[Arm, RowArrays]

    def span(self) -> tuple[float, float] | None:
        """(first, last) request start of the primary rows of either arm; None: none."""
        times = [
            np.asarray(a["t_start"], dtype=np.float64)[~np.asarray(a["shadow"], dtype=bool)]
            for a in self.arrays.values()
        ]
        times = [t for t in times if t.size]
        if not times:
            return None
        return float(min(t.min() for t in times)), float(max(t.max() for t in times))

    def until(self, limit: float) -> tuple[Rows, int, float | None]:
        """The rows that started at or before `limit` (now plus the skew allowance), the primary
        rows left out (stamped later: a clock stepped back, a replica's clock running fast) and
        the newest start among them (None: none)."""
        kept: dict[Arm, RowArrays] = {}
        future = 0
        newest: float | None = None
        for arm, arrays in self.arrays.items():
            t = np.asarray(arrays["t_start"], dtype=np.float64)
            late = t > limit
            if not late.any():
                kept[arm] = arrays
                continue
            primary = late & ~np.asarray(arrays["shadow"], dtype=bool)
            if primary.any():
                future += int(primary.sum())
                top = float(t[primary].max())
                newest = top if newest is None else max(newest, top)
            kept[arm] = {name: np.asarray(column)[~late] for name, column in arrays.items()}
        return Rows(kept), future, newest

    def tiers(self, unit_s: float, label: Callable[[str], str]) -> Tiers:
        """The primary rows as fine units of `unit_s` seconds, keyed by `label(model)`."""
        metrics = {m: {arm: ArmTier() for arm in self.arrays} for m in ROLLUP_METRICS}
        moments: list[tuple[Any, ...]] = []
        for arm, arrays in self.arrays.items():
            primary = ~np.asarray(arrays["shadow"], dtype=bool)
            t = np.asarray(arrays["t_start"], dtype=np.float64)[primary]
            unit = np.floor(t / unit_s).astype(np.int64)
            names, key = _labels(np.asarray(arrays["model"])[primary], label)
            for metric, column in ROLLUP_METRICS.items():
                values = np.asarray(arrays[column], dtype=np.float64)[primary]
                ok = np.isfinite(values) & (values > 0)
                _fill(metrics[metric][arm], unit[ok], key[ok], names, values[ok])
            moments.extend(_moment_rows(arrays, primary, unit, key, names, arm))
        return Tiers(unit_s, metrics, moment_units=moments)

    def condition_tiers(self, unit_s: float) -> Tiers:
        """The primary rows' condition summaries (`summary.conditions`) as fine units of
        `unit_s` seconds, keyed and binned as the store's writer keys and bins them (coarse)."""
        metrics = {m: {arm: ArmTier() for arm in self.arrays} for m in CONDITION_METRICS}
        for arm, arrays in self.arrays.items():
            primary = ~np.asarray(arrays["shadow"], dtype=bool)
            unit = np.floor(np.asarray(arrays["t_start"], dtype=np.float64)[primary] / unit_s)
            unit = unit.astype(np.int64)
            columns = {c: np.asarray(a)[primary] for c, a in arrays.items()}
            by_dim = dimension_keys(columns, unit.size)
            for stored, (_metric, column) in CONDITION_METRICS.items():
                values = np.asarray(arrays[column], dtype=np.float64)[primary]
                ok = np.isfinite(values) & (values > 0)
                for dim in DIMENSIONS:
                    labels = by_dim[dim]
                    keep = ok & (labels != "")
                    names, key = _labels(labels[keep], lambda k: k)
                    _fill(metrics[stored][arm], unit[keep], key, names, values[keep], coarse=True)
        return Tiers(unit_s, metrics, has_moments=False)

    def load_cells(self, arm: Arm, metric: str, plan: WindowPlan, excluded: set[int]) -> LoadSample:
        """Each primary request of `arm` in the window's units (less `excluded`) at its own
        load and `metric` latency, for the crossover (`stats.estimate.crossover`)."""
        arrays = self.arrays.get(arm)
        if arrays is None:
            return LoadSample.of(np.zeros(0), np.zeros(0, dtype=np.int64), np.zeros(0))
        primary = ~np.asarray(arrays["shadow"], dtype=bool)
        unit = np.floor(np.asarray(arrays["t_start"], dtype=np.float64) / plan.unit_s)
        unit = unit.astype(np.int64)
        keep = primary & (unit >= plan.lo) & (unit <= plan.hi)
        if excluded:
            keep &= ~np.isin(unit, sorted(excluded))

        def numbers(column: str) -> FloatArray:
            values = np.asarray(arrays[column])[keep]
            return np.array([np.nan if v is None else v for v in values.tolist()], dtype=float)

        return LoadSample.of(
            numbers("endpoint_in_flight"), unit[keep] - plan.lo, numbers(ROLLUP_METRICS[metric])
        )

    def pairs(
        self,
        plan: WindowPlan,
        excluded: Mapping[Arm, set[int]],
        names: tuple[Arm, Arm] = (SHORTHAND_CONTROL, SHORTHAND_TREATMENT),
    ) -> Pairs | None:
        """The window's complete mirrored pairs of the (control, treatment) arms `names` (both
        members usable, in units of `plan` not left out as warm-up by either arm); None when
        there are none."""
        control_arm, treatment_arm = names
        if control_arm not in self.arrays or treatment_arm not in self.arrays:
            return None
        b, s = self.arrays[control_arm], self.arrays[treatment_arm]
        b_ids, b_at = _ids(b)
        s_ids, s_at = _ids(s)
        _, bi, si = np.intersect1d(b_ids, s_ids, return_indices=True)
        if bi.size == 0:
            return None
        b_rows, s_rows = b_at[bi], s_at[si]
        b_t = np.asarray(b["t_start"], dtype=np.float64)[b_rows]
        s_t = np.asarray(s["t_start"], dtype=np.float64)[s_rows]
        b_unit = np.floor(b_t / plan.unit_s).astype(np.int64)
        s_unit = np.floor(s_t / plan.unit_s).astype(np.int64)
        unit = np.floor(np.minimum(b_t, s_t) / plan.unit_s).astype(np.int64)
        keep = (unit >= plan.lo) & (unit <= plan.hi)
        keep &= ~np.isin(b_unit, list(excluded.get(control_arm, ())))
        keep &= ~np.isin(s_unit, list(excluded.get(treatment_arm, ())))
        control: dict[str, FloatArray] = {}
        treatment: dict[str, FloatArray] = {}
        units: dict[str, IntArray] = {}
        for metric, column in ROLLUP_METRICS.items():
            bv = np.asarray(b[column], dtype=np.float64)[b_rows]
            sv = np.asarray(s[column], dtype=np.float64)[s_rows]
            ok = keep & np.isfinite(bv) & np.isfinite(sv) & (bv > 0) & (sv > 0)
            control[metric], treatment[metric] = bv[ok], sv[ok]
            units[metric] = unit[ok] - plan.lo
        if control["e2e"].size == 0:
            return None
        return Pairs(control, treatment, units, plan.units, plan.unit_s)


def _ids(arrays: RowArrays) -> tuple[npt.NDArray[Any], IntArray]:
    raw = np.asarray(arrays["pair_id"], dtype=object)
    where = np.flatnonzero(np.array([p is not None for p in raw], dtype=bool))
    return raw[where].astype(str), where.astype(np.int64)


def _labels(models: npt.NDArray[Any], label: Callable[[str], str]) -> tuple[list[str], IntArray]:
    """The distinct labels of `models` and each row's index into them."""
    raw, inverse = np.unique(models.astype(str), return_inverse=True)
    labelled = [label(str(m)) for m in raw]
    names = sorted(set(labelled))
    index = np.array([names.index(x) for x in labelled], dtype=np.int64)
    return names, index[inverse] if inverse.size else np.zeros(0, dtype=np.int64)


def _fill(
    tier: ArmTier,
    unit: IntArray,
    key: IntArray,
    names: list[str],
    v: FloatArray,
    *,
    coarse: bool = False,
) -> None:
    """Add the values' fine units (one per (unit, key)) to `tier`; `coarse`: binned as the
    writer bins condition rollups (the centre of each value's coarse bin)."""
    if v.size == 0:
        return
    first = int(unit.min())
    group = (unit - first) * len(names) + key
    bins = coarse_as_fine(coarse_bin(bin_index(v))) if coarse else bin_index(v)
    order = np.lexsort((bins, group))
    group, bins, v = group[order], bins[order], v[order]
    new_group = np.concatenate([[True], group[1:] != group[:-1]])
    starts = np.flatnonzero(new_group)
    ends = np.append(starts[1:], group.size)
    # runs of one (group, bin): each group's histogram is a slice of them, counted in one pass
    runs = np.flatnonzero(new_group | np.concatenate([[True], bins[1:] != bins[:-1]]))
    run_bins = bins[runs].astype(np.int64)
    run_counts = np.diff(np.append(runs, bins.size)).astype(np.int64)
    run_of_start = np.searchsorted(runs, starts)
    run_of_end = np.append(run_of_start[1:], runs.size)
    for a, z, ra, rz in zip(
        starts.tolist(), ends.tolist(), run_of_start.tolist(), run_of_end.tolist(), strict=True
    ):
        g = int(group[a])
        values = v[a:z]
        tier.fine[(g // len(names) + first, names[g % len(names)])] = FineMinute(
            int(z - a),
            float(values.sum()),
            float(values @ values),
            run_bins[ra:rz],
            run_counts[ra:rz],
        )


def _moment_rows(
    arrays: RowArrays,
    primary: npt.NDArray[np.bool_],
    unit: IntArray,
    key: IntArray,
    names: list[str],
    arm: Arm,
) -> list[tuple[Any, ...]]:
    """`MOMENT_SUMS` per (unit, key) of the primary rows that report both token counts."""
    e2e = np.asarray(arrays["e2e_s"], dtype=np.float64)[primary]
    out_tok = np.asarray(arrays["output_tokens"], dtype=np.float64)[primary]
    prompt = np.asarray(arrays["prompt_tokens"], dtype=np.float64)[primary]
    ok = np.isfinite(e2e) & (e2e > 0) & np.isfinite(out_tok) & (out_tok > 0)
    ok &= np.isfinite(prompt) & (prompt > 0)
    if not ok.any():
        return []
    y, u, v = np.log(e2e[ok]), np.log(out_tok[ok]), np.log(prompt[ok])
    groups, inverse = np.unique(np.stack([unit[ok], key[ok]]), axis=1, return_inverse=True)
    inverse = inverse.reshape(-1)
    columns = (np.ones_like(y), u, v, u * u, v * v, u * v, y, u * y, v * y, y * y)
    sums = np.stack([np.bincount(inverse, weights=c, minlength=groups.shape[1]) for c in columns])
    return [
        (int(groups[0, i]), names[int(groups[1, i])], arm, *(float(x) for x in sums[:, i]))
        for i in range(groups.shape[1])
    ]


def known_label(known: set[str], other: str = "other") -> Callable[[str], str]:
    """Rows keep the client's model string; the summaries are keyed by its bounded label. A row's
    model is its own label when the summaries know it, else `other`."""

    def label(model: str) -> str:
        return model if model in known else other

    return label
