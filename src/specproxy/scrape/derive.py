"""Two consecutive snapshots -> one version-independent `EngineSample`.

V1 rates come from counter deltas, so they describe exactly the interval between two scrapes:
acceptance rate = Δaccepted / Δdraft tokens, mean acceptance length = 1 + Δaccepted / Δdrafts,
the rate at draft position i = Δaccepted_i / Δdrafts. An interval without drafts has no rate
(None), never a made-up zero.

V0 counters are incremented with cumulative totals (the "sum-of-sums" bug, vLLM PR #15415), so
their deltas are meaningless; V0 figures come from its gauges, which are cumulative since engine
start. V0 exports no mean acceptance length and no k, but both follow from the gauges plus one
ratio of the counters that the bug leaves intact (see `_v0_mean_acceptance_length`).

A restart (the process start time changed, or any counter went down) voids the deltas of that
interval: the sample is marked `restarted` and carries no rates.

One URL can also answer from several engines: a ClusterIP Service or any load balancer in front
of them. Its scrapes then change process between rounds, which reads like restarts that are not.
`classify_change` tells the two apart: a process that started before the previous scrape (it was
running while the URL answered from another one), an older process than the one just seen, or a
start time seen before behind this URL is another engine, never a restart (a restarted engine
never comes back to its old process). Only a newer process that started after the previous
scrape can be a restart: behind a balancer that is an engine that just started (a new pod), whose
warm-up is worth excluding anyway, and the balancer's next pick of an older one then shows it.

Without start times to compare (an engine that exports no `process_start_time_seconds`, as vLLM
with `--api-server-count` > 1 serves its metrics from a multiprocess registry, or two processes
that read the same one), a counter that went down is `Change.COUNTERS_DOWN`: a restart, or
another engine behind the URL. The next good scrape tells (`aggregate.ArmAggregate`): counters
that come back to at least those before the drop went back and forth, which a restarted engine's
never do, so the URL is load-balanced; otherwise the drop was a restart, dated as if it had been
seen at once.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Container

from specproxy.records import Arm, EngineSample
from specproxy.scrape.parse import EngineSnapshot, SpecFormat

__all__ = [
    "START_SLACK_S",
    "Change",
    "classify_change",
    "date_restart",
    "derive_sample",
    "is_restart",
    "restart_time",
]

# How much earlier than the previous scrape a restarted engine's start time may read: vLLM's
# reads ~1 s early, and the proxy's and the engine's clocks differ by a little.
START_SLACK_S = 5.0


class Change(enum.Enum):
    """What happened behind one URL between two of its scrapes."""

    NONE = "none"  # the same process, its counters only went up
    RESTART = "restart"  # the process start time moved on, or a counter went down
    OTHER_ENGINE = "other_engine"  # another engine process answered: a load-balanced URL
    # a counter went down and no change of start time explains it: a restart or another engine,
    # which the next scrape tells apart
    COUNTERS_DOWN = "counters_down"


def classify_change(
    prev: EngineSnapshot, cur: EngineSnapshot, seen_starts: Container[float]
) -> Change:
    """How `cur` relates to `prev`, the previous scrape of the same URL; `seen_starts` are the
    process start times seen behind that URL before."""
    before, now = prev.process_start_time, cur.process_start_time
    if before is not None and now is not None and now != before:
        if now in seen_starts or now < before or now < prev.t - START_SLACK_S:
            return Change.OTHER_ENGINE
        return Change.RESTART
    return Change.COUNTERS_DOWN if is_restart(prev, cur) else Change.NONE


def is_restart(prev: EngineSnapshot, cur: EngineSnapshot) -> bool:
    """True when the engine restarted between the two scrapes."""
    if (
        prev.process_start_time is not None
        and cur.process_start_time is not None
        and cur.process_start_time != prev.process_start_time
    ):
        return True
    before = prev.counters()
    return any(value < before[name] for name, value in cur.counters().items() if name in before)


def date_restart(
    seen_at: float, start: float | None, previous: float | None, first_failed: float | None
) -> float:
    """When a restart seen at `seen_at` happened: the start of its warm-up window.

    `start` is the new process start time (None if unknown), `previous` the last good scrape,
    `first_failed` the first failed scrape since then (None if none failed). vLLM's start time
    can read ~1 s early against the wall clock, so after failed scrapes the restart is dated no
    earlier than the first of them: the new engine served nothing while the arm was down, and the
    old one served nothing after it. Otherwise the start time when it is plausible, else the
    previous scrape: the earliest moment it can have happened, so a window never starts late.
    """
    if first_failed is not None:
        return min(max(start, first_failed) if start is not None else first_failed, seen_at)
    low = previous if previous is not None else -math.inf
    if start is not None and low <= start <= seen_at:
        return start
    return previous if previous is not None else seen_at


def restart_time(
    prev: EngineSnapshot, cur: EngineSnapshot, first_failed: float | None = None
) -> float:
    """`date_restart` for two consecutive good snapshots (and the failed scrapes between)."""
    start = cur.process_start_time
    new_start = start if start is not None and start != prev.process_start_time else None
    return date_restart(cur.t, new_start, prev.t, first_failed)


def derive_sample(
    prev: EngineSnapshot | None, cur: EngineSnapshot, *, run_id: str, arm: Arm
) -> EngineSample:
    """Reduce `cur` (and its predecessor, None on the first scrape) to an `EngineSample`."""
    restarted = prev is not None and is_restart(prev, cur)
    base = prev if prev is not None and not restarted else None
    acceptance_rate: float | None = None
    mean_length: float | None = None
    positions: tuple[float, ...] | None = None
    if cur.spec_format is SpecFormat.V0:
        acceptance_rate = cur.v0_acceptance_rate
        mean_length = _v0_mean_acceptance_length(cur)
    elif cur.spec_format is SpecFormat.V1 and base is not None:
        d_draft_tokens = _delta(base.num_draft_tokens, cur.num_draft_tokens)
        d_accepted = _delta(base.num_accepted_tokens, cur.num_accepted_tokens)
        d_drafts = _delta(base.num_drafts, cur.num_drafts)
        if d_draft_tokens and d_accepted is not None:
            acceptance_rate = d_accepted / d_draft_tokens
        if d_drafts and d_accepted is not None:
            mean_length = 1.0 + d_accepted / d_drafts
        if d_drafts and cur.accepted_per_position is not None:
            old = base.accepted_per_position or ()
            positions = tuple(
                (value - (old[pos] if pos < len(old) else 0.0)) / d_drafts
                for pos, value in enumerate(cur.accepted_per_position)
            )
    tokens_per_s: float | None = None
    if base is not None and cur.t > base.t:
        d_generated = _delta(base.generation_tokens, cur.generation_tokens)
        if d_generated is not None:
            tokens_per_s = d_generated / (cur.t - base.t)
    return EngineSample(
        t=cur.t,
        run_id=run_id,
        arm=arm,
        up=True,
        restarted=restarted,
        acceptance_rate=acceptance_rate,
        mean_acceptance_length=mean_length,
        position_acceptance=positions,
        requests_running=cur.requests_running,
        requests_waiting=cur.requests_waiting,
        kv_cache_usage=cur.kv_cache_usage,
        generation_tokens_per_s=tokens_per_s,
        process_start_time=cur.process_start_time,
    )


def _delta(before: float | None, after: float | None) -> float | None:
    return after - before if before is not None and after is not None else None


def _v0_mean_acceptance_length(snap: EngineSnapshot) -> float | None:
    """Tokens emitted per speculative step on a V0 engine, from its gauges.

    With k draft tokens per step and L tokens emitted per step, V0 defines
    efficiency η = L / (k + 1) and counts draft = k·steps, emitted = L·steps. The sum-of-sums
    counters are sums of those cumulative totals taken at the same instants, so their ratio
    r = emitted_total / draft_total is still L / k (exactly, while L/k is stable). Then
    1/η − 1/r = 1/L, i.e. k = η / (r − η); k is an integer, so rounding it absorbs the drift in r,
    and L = η·(k + 1) uses only the exact gauge.
    """
    eff, emitted, draft = snap.v0_efficiency, snap.num_emitted_tokens, snap.num_draft_tokens
    if eff is None or emitted is None or not draft or eff <= 0:
        return None
    ratio = emitted / draft
    if ratio <= eff:
        return None
    k = round(eff / (ratio - eff))
    return eff * (k + 1) if k >= 1 else None
