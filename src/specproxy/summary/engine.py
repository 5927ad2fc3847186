"""Mergeable aggregates of engine samples and the few samples that date restarts (pure).

A stats tick needs two things from a run's engine samples (`scrape.loop` stores one per arm per
replica every `scrape.interval_s`: 518,400 per arm per replica over 30 days):

  * per window and arm, counts and means (`EngineAggregate`, summarised by
    `stats.diagnosis.summarise_aggregate`): sums, counts and a maximum, so a store keeps them
    per hour as samples are written (`store.enginehours`) and answers a window with at most an
    hour of samples plus one row per hour, instead of handing every sample to Python;
  * the dated restarts (`stats.warmup.restart_times`), which depend only on each restarted sample,
    the last good sample before it and the first failed scrape after that one
    (`restart_evidence`): a store reads those by indexed queries.

Means over the aggregate equal `sum(values) / len(values)` of the old per-sample summary up to
the rounding of the sum (summed per hour, then the hours; SQLite with compensated summation):
relative differences ~1e-15, tested to 1e-12. Counts, restarts and k are exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from specproxy.records import Arm, EngineSample

__all__ = [
    "MEAN_FIELDS",
    "EngineAggregate",
    "EngineView",
    "SampleView",
    "StoredView",
    "aggregate_samples",
    "as_view",
    "restart_evidence",
]

# The EngineSample fields averaged over the up samples of a window (None and non-finite ignored).
MEAN_FIELDS: tuple[str, ...] = (
    "acceptance_rate",
    "mean_acceptance_length",
    "requests_running",
    "kv_cache_usage",
)


@dataclass(frozen=True, slots=True)
class EngineAggregate:
    """One arm's engine samples over a window, as sums and counts.

    `sums[i]` / `counts[i]`: sum and number of the finite values of `MEAN_FIELDS[i]` over up
    samples; `max_k`: the longest non-empty per-position acceptance of an up sample (None: none).
    """

    samples: int = 0
    restarts: int = 0  # samples marked restarted (up or not)
    up_samples: int = 0
    sums: tuple[float, ...] = (0.0,) * len(MEAN_FIELDS)
    counts: tuple[int, ...] = (0,) * len(MEAN_FIELDS)
    max_k: int | None = None

    def merge(self, other: EngineAggregate) -> EngineAggregate:
        """The aggregate of both windows' samples (disjoint sets of samples)."""
        ks = [k for k in (self.max_k, other.max_k) if k is not None]
        return EngineAggregate(
            samples=self.samples + other.samples,
            restarts=self.restarts + other.restarts,
            up_samples=self.up_samples + other.up_samples,
            sums=tuple(a + b for a, b in zip(self.sums, other.sums, strict=True)),
            counts=tuple(a + b for a, b in zip(self.counts, other.counts, strict=True)),
            max_k=max(ks) if ks else None,
        )

    def mean(self, field: str) -> float | None:
        """The mean of `field` (one of `MEAN_FIELDS`) over the up samples reporting it."""
        i = MEAN_FIELDS.index(field)
        return self.sums[i] / self.counts[i] if self.counts[i] else None


def aggregate_samples(samples: Iterable[EngineSample]) -> EngineAggregate:
    """The aggregate of `samples` (one arm's), summed in their order."""
    n = restarts = up = 0
    sums = [0.0] * len(MEAN_FIELDS)
    counts = [0] * len(MEAN_FIELDS)
    max_k: int | None = None
    for s in samples:
        n += 1
        restarts += bool(s.restarted)
        if not s.up:
            continue
        up += 1
        for i, name in enumerate(MEAN_FIELDS):
            value = getattr(s, name)
            if value is not None and math.isfinite(value):
                sums[i] += value
                counts[i] += 1
        if s.position_acceptance:
            k = len(s.position_acceptance)
            max_k = k if max_k is None else max(max_k, k)
    return EngineAggregate(n, restarts, up, tuple(sums), tuple(counts), max_k)


def restart_evidence(samples: Sequence[EngineSample], arm: Arm) -> list[EngineSample]:
    """The samples of `arm` that `stats.warmup.restart_times` reads to date its restarts, in time
    order: each up sample marked restarted, the last up sample before it and the first failed
    scrape between those two. `restart_times` of these equals `restart_times` of all `samples`
    (time order, one sample per arm and time, as every store keeps them); a store selects the
    same rows by index (`SummaryReader.read_engine`)."""
    mine = [s for s in samples if s.arm == arm]
    keep: dict[int, EngineSample] = {}
    last_up: int | None = None
    first_failed: int | None = None
    for i, s in enumerate(mine):
        if not s.up:
            if first_failed is None:
                first_failed = i
            continue
        if s.restarted:
            keep[i] = s
            if last_up is not None:
                keep[last_up] = mine[last_up]
            if first_failed is not None:
                keep[first_failed] = mine[first_failed]
        last_up, first_failed = i, None
    return [keep[i] for i in sorted(keep)]


@dataclass(frozen=True, slots=True)
class SampleView:
    """A run's engine samples themselves (any arm, time order): what a tick read before the
    store could aggregate, and what `specproxy report` and tests still pass."""

    samples: Sequence[EngineSample]

    @property
    def restart_samples(self) -> Sequence[EngineSample]:
        """Samples enough for `stats.warmup.restart_times` (here: all of them)."""
        return self.samples

    @property
    def arms(self) -> set[Arm]:
        return {s.arm for s in self.samples}

    def aggregate(self, arm: Arm, since: float) -> EngineAggregate:
        """The aggregate of `arm`'s samples at or after `since`."""
        return aggregate_samples(s for s in self.samples if s.arm == arm and s.t >= since)


@dataclass(frozen=True, slots=True)
class StoredView:
    """What a store computed for one tick (`SummaryReader.read_engine`): the aggregates for the
    window starts the tick asked for, and the restart evidence."""

    aggregates: Mapping[float, Mapping[Arm, EngineAggregate]]  # by window start (-inf: all)
    restart_samples: Sequence[EngineSample]

    @property
    def arms(self) -> set[Arm]:
        return {arm for per_arm in self.aggregates.values() for arm in per_arm}

    def aggregate(self, arm: Arm, since: float) -> EngineAggregate:
        """The aggregate of `arm`'s samples at or after `since`, which must be a start the
        store was asked for (a ValueError otherwise: a window the tick did not plan)."""
        try:
            return self.aggregates[since].get(arm, EngineAggregate())
        except KeyError:
            raise ValueError(f"no engine aggregate read for windows starting at {since}") from None


EngineView = SampleView | StoredView


def as_view(engine: Sequence[EngineSample] | EngineView) -> EngineView:
    """`engine` as a view: samples become a `SampleView`."""
    if isinstance(engine, SampleView | StoredView):
        return engine
    return SampleView(engine)
