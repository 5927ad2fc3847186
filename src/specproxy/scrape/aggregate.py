"""An arm's scrapes, one per endpoint, -> one arm-level `EngineSample`.

Each endpoint is its own engine: its counters are only ever compared with its own previous
scrape, so a load-balanced fleet never reads as one engine whose counters jump. Per endpoint the
round computes deltas and detects restarts (`derive.is_restart`); the arm's V1 rates are then
ratios of the summed deltas (acceptance = ΣΔaccepted / ΣΔdraft tokens over the endpoints that
have a usable previous scrape), never an average of per-endpoint ratios.

Endpoints come and go (discovery, scale-up, a pod replaced): an endpoint seen for the first time
has no previous scrape, so it contributes no delta and is no restart; an endpoint that left the
list is forgotten, and the arm's totals are not touched, so neither is a counter reset of the
arm. Only an endpoint whose own start time changed, or whose own counter went down, is a
restart. An endpoint that fails a scrape keeps its last good snapshot, and the failure streak
dates a restart seen when it comes back (`derive.restart_time`).

One URL that answers from several engines (a load-balanced Service: `derive.classify_change`)
is marked `balanced` and listed once in `newly_balanced` (the scraper warns). From then on none
of its changes is a restart, and its counters are compared only with the last scrape of the
same process (by start time), so its acceptance stays a ratio of real deltas; its gauges and
token rate describe one engine of several and are not summed as the URL's.

A counter that went down with no change of start time to explain it (`Change.COUNTERS_DOWN`:
engines that export no start time) is decided at the endpoint's next good scrape: counters back
at or above those before the drop went back and forth, so the URL is load-balanced and no
restart is recorded; otherwise the drop was a restart, counted then and dated by the scrapes
around the drop (the arm's sample of that next round carries `restarted`). The interval of the
drop adds no delta either way.

Pure: no I/O, the scrapes and their times are handed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from specproxy.records import Arm, EngineSample
from specproxy.scrape.derive import (
    Change,
    classify_change,
    derive_sample,
    is_restart,
    restart_time,
)
from specproxy.scrape.parse import EngineSnapshot, SpecFormat

__all__ = ["ArmAggregate", "EndpointState"]


@dataclass(slots=True)
class EndpointState:
    """What the scraper knows about one endpoint of an arm."""

    url: str
    up: bool | None = None  # None until its first scrape finished
    error: str | None = None  # why its last scrape failed
    snapshot: EngineSnapshot | None = None  # its last good scrape
    sample: EngineSample | None = None  # derived from its last good scrape
    first_failed: float | None = None  # first failed scrape since its last good one
    restarts: int = 0
    balanced: bool = False  # answers from several engine processes (a load-balanced URL)
    # The last scrape of each process seen behind this URL, by start time (the newest few).
    by_start: dict[float, EngineSnapshot] = field(default_factory=dict)
    # A counter drop awaiting the next good scrape (`Change.COUNTERS_DOWN`): the last good scrape
    # before it, and the first failed scrape between that one and the drop.
    before_drop: EngineSnapshot | None = None
    drop_first_failed: float | None = None


_KEPT_STARTS = 16  # process start times remembered per URL


@dataclass(slots=True)
class _Sums:
    draft_tokens: float = 0.0
    accepted: float = 0.0
    drafts: float = 0.0
    positions: list[float] = field(default_factory=list)
    tokens_per_s: float | None = None
    v0_weight: float = 0.0
    v0_rate: float = 0.0
    v0_length_weight: float = 0.0
    v0_length: float = 0.0


class ArmAggregate:
    """Per-endpoint scrape state of one arm, and the arm's sample each round."""

    def __init__(self, arm: Arm, run_id: str) -> None:
        self.arm = arm
        self._run_id = run_id
        self._endpoints: dict[str, EndpointState] = {}
        self.restart_times: list[float] = []  # one per endpoint restart, dated per endpoint
        self.newly_balanced: list[str] = []  # URLs found load-balanced in the last round

    @property
    def endpoints(self) -> Mapping[str, EndpointState]:
        return self._endpoints

    def update(self, t: float, results: Mapping[str, EngineSnapshot | str]) -> EngineSample:
        """One round at time `t`: each endpoint's snapshot, or why its scrape failed.

        `results` names every endpoint of the arm now; endpoints missing from it are dropped.
        """
        for url in [u for u in self._endpoints if u not in results]:
            del self._endpoints[url]
        sums = _Sums()
        self.newly_balanced = []
        restarted_starts: list[float | None] = []
        up_snapshots: list[EngineSnapshot] = []
        spec = False
        for url, result in results.items():
            state = self._endpoints.setdefault(url, EndpointState(url))
            if isinstance(result, str):
                state.up, state.error = False, result
                if state.first_failed is None:
                    state.first_failed = t
                continue
            prev = state.snapshot
            sample = derive_sample(prev, result, run_id=self._run_id, arm=self.arm)
            if prev is not None:
                self._compare(state, prev, result, sums, restarted_starts)
            _add_v0(sums, result, sample)
            spec = spec or result.spec_format is not None
            state.up, state.error, state.snapshot, state.sample = True, None, result, sample
            state.first_failed = None
            if result.process_start_time is not None:
                _remember(state, result)
            if not state.balanced:
                up_snapshots.append(result)
        if not up_snapshots:  # every URL is down, or load-balanced: one engine of several
            up_snapshots = [
                s.snapshot for s in self._endpoints.values() if s.up and s.snapshot is not None
            ]
        if not up_snapshots:
            return EngineSample(t=t, run_id=self._run_id, arm=self.arm, up=False)
        acceptance, length, positions = _rates(sums) if spec else (None, None, None)
        starts = [s for s in restarted_starts if s is not None] or [
            s.process_start_time for s in up_snapshots if s.process_start_time is not None
        ]
        return EngineSample(
            t=t,
            run_id=self._run_id,
            arm=self.arm,
            up=True,
            restarted=bool(restarted_starts),
            acceptance_rate=acceptance,
            mean_acceptance_length=length,
            position_acceptance=positions,
            requests_running=_sum(s.requests_running for s in up_snapshots),
            requests_waiting=_sum(s.requests_waiting for s in up_snapshots),
            kv_cache_usage=_mean(s.kv_cache_usage for s in up_snapshots),
            generation_tokens_per_s=sums.tokens_per_s,
            process_start_time=max(starts) if starts else None,
        )

    def _compare(
        self,
        state: EndpointState,
        prev: EngineSnapshot,
        cur: EngineSnapshot,
        sums: _Sums,
        restarted_starts: list[float | None],
    ) -> None:
        """Add `cur`'s deltas over `prev` (its URL's last good scrape) to `sums`, unless a
        change lies between: a restart adds its start time to `restarted_starts`, another
        engine behind the URL marks it `balanced`."""
        if state.balanced:
            base = state.by_start.get(cur.process_start_time or math.nan)
            if base is not None and base.t < cur.t and not is_restart(base, cur):
                _add_deltas(sums, base, cur, token_rate=False)
            return
        before_drop, state.before_drop = state.before_drop, None
        if before_drop is not None:  # `prev` showed a counter drop: `cur` tells what it was
            if not is_restart(before_drop, cur):  # back to the counters before it: two engines
                self._balance(state)
                return
            self._restart(state, before_drop, prev, state.drop_first_failed, restarted_starts)
        change = classify_change(prev, cur, state.by_start.keys() - {prev.process_start_time})
        if change is Change.OTHER_ENGINE:
            self._balance(state)
        elif change is Change.RESTART:
            self._restart(state, prev, cur, state.first_failed, restarted_starts)
        elif change is Change.COUNTERS_DOWN:
            state.before_drop, state.drop_first_failed = prev, state.first_failed
        else:
            _add_deltas(sums, prev, cur)

    def _restart(
        self,
        state: EndpointState,
        prev: EngineSnapshot,
        cur: EngineSnapshot,
        first_failed: float | None,
        restarted_starts: list[float | None],
    ) -> None:
        """Count the restart between `prev` and `cur`, the endpoint's scrapes around it."""
        self.restart_times.append(restart_time(prev, cur, first_failed))
        state.restarts += 1
        restarted_starts.append(cur.process_start_time)

    def _balance(self, state: EndpointState) -> None:
        state.balanced = True
        self.newly_balanced.append(state.url)


def _remember(state: EndpointState, snap: EngineSnapshot) -> None:
    """Keep `snap` as the last scrape of its process (the newest `_KEPT_STARTS` processes)."""
    assert snap.process_start_time is not None
    state.by_start.pop(snap.process_start_time, None)
    state.by_start[snap.process_start_time] = snap
    while len(state.by_start) > _KEPT_STARTS:
        del state.by_start[next(iter(state.by_start))]


def _add_deltas(
    sums: _Sums, prev: EngineSnapshot, cur: EngineSnapshot, *, token_rate: bool = True
) -> None:
    """Add one endpoint's counter deltas since its previous scrape (no restart between)."""
    if (
        token_rate
        and cur.t > prev.t
        and prev.generation_tokens is not None
        and cur.generation_tokens is not None
    ):
        rate = (cur.generation_tokens - prev.generation_tokens) / (cur.t - prev.t)
        sums.tokens_per_s = (sums.tokens_per_s or 0.0) + rate
    if cur.spec_format is not SpecFormat.V1:
        return
    d_tokens = _delta(prev.num_draft_tokens, cur.num_draft_tokens)
    d_accepted = _delta(prev.num_accepted_tokens, cur.num_accepted_tokens)
    d_drafts = _delta(prev.num_drafts, cur.num_drafts)
    if d_tokens is not None and d_accepted is not None:
        sums.draft_tokens += d_tokens
        sums.accepted += d_accepted
    if d_drafts is not None and d_accepted is not None:
        sums.drafts += d_drafts
        old = prev.accepted_per_position or ()
        for pos, value in enumerate(cur.accepted_per_position or ()):
            if pos == len(sums.positions):
                sums.positions.append(0.0)
            sums.positions[pos] += value - (old[pos] if pos < len(old) else 0.0)


def _add_v0(sums: _Sums, snap: EngineSnapshot, sample: EngineSample) -> None:
    """V0 figures are cumulative gauges: weight each endpoint's by its drafted tokens."""
    if snap.spec_format is not SpecFormat.V0:
        return
    weight = snap.num_draft_tokens or 0.0
    if sample.acceptance_rate is not None and weight > 0:
        sums.v0_weight += weight
        sums.v0_rate += weight * sample.acceptance_rate
    if sample.mean_acceptance_length is not None and weight > 0:
        sums.v0_length_weight += weight
        sums.v0_length += weight * sample.mean_acceptance_length


def _rates(sums: _Sums) -> tuple[float | None, float | None, tuple[float, ...] | None]:
    acceptance = sums.accepted / sums.draft_tokens if sums.draft_tokens > 0 else None
    length = 1.0 + sums.accepted / sums.drafts if sums.drafts > 0 else None
    positions = (
        tuple(v / sums.drafts for v in sums.positions)
        if sums.drafts > 0 and sums.positions
        else None
    )
    if acceptance is None and sums.v0_weight > 0:
        acceptance = sums.v0_rate / sums.v0_weight
    if length is None and sums.v0_length_weight > 0:
        length = sums.v0_length / sums.v0_length_weight
    return acceptance, length, positions


def _delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def _sum(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) if present else None


def _mean(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None
