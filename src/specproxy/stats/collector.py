"""Publishes the stats job's latest result as Prometheus gauges, read at scrape time.

A custom Collector (rather than Gauges set by the job) means a scrape always sees one coherent
result, and series of a model or window that disappeared vanish instead of going stale. Every
comparison's series carry `arm`, the treatment compared with the control (A/B/n: one per
treatment, so bounded by the configured arms; the two-arm run's is "speculative").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple, cast

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector, CollectorRegistry

from specproxy import metrics as names
from specproxy.stats.result import Conditions, StatsResult, comparisons_of

__all__ = ["StatsCollector", "register_stats_collector"]


class StatsCollector(Collector):
    """Turns `latest()` (the job's result, or None before the first run) into gauges."""

    def __init__(
        self,
        latest: Callable[[], StatsResult | None],
        leader: Callable[[], bool | None] | None = None,
    ) -> None:
        self._latest = latest
        self._leader = leader

    def collect(self) -> Iterator[Metric]:
        speedup = GaugeMetricFamily(
            names.SPEEDUP,
            "Speedup = statistic(control) / statistic(treatment `arm`) with its CI bounds.",
            labels=["model", "window", "arm", "metric", "statistic", "bound"],
        )
        samples = GaugeMetricFamily(
            names.SAMPLES,
            "Requests used by the comparison, per arm (after warm-up exclusion).",
            labels=["model", "window", "arm"],
        )
        verdict = StateSetMetricFamily(
            names.VERDICT,
            "Anytime-valid verdict per compared metric: a state set, 1 on the current state"
            f" ({', '.join(names.VERDICT_STATES)}), 0 on the others.",
            labels=["model", "window", "arm", "metric"],
        )
        gate = StateSetMetricFamily(
            names.GATE,
            "Rollout gate per window (E2E): pass (faster, or median and P99 not slower than"
            " 1+tol), fail (slower), wait (neither yet); 1 on the current state.",
            labels=["model", "window", "arm"],
        )
        slowdown = GaugeMetricFamily(
            names.P99_SLOWDOWN,
            "1 while the anytime-valid P99 verdict is slower: speculative P99 > baseline P99"
            " x (1+tol) by the union-bound CS or, on split traffic, the per-minute exceedance"
            " e-process (mirrored pairs: the two-sample e-process), each at alpha/2.",
            labels=["model", "window", "arm", "metric"],
        )
        tokens_per_step = GaugeMetricFamily(
            names.SPECULATION_TOKENS_PER_STEP,
            "Tokens a speculative step yields on average (vLLM's mean acceptance length, else"
            " 1 + k x its accepted/drafted ratio), as the diagnosis reads it.",
            labels=["model", "window", "arm"],
        )
        break_even = GaugeMetricFamily(
            names.SPECULATION_BREAK_EVEN,
            "1 + k x c: the target steps a speculative step costs (c, one draft pass over one"
            " target pass, measured from step times or assumed); speculation can pay only while"
            " the tokens per step exceed it.",
            labels=["model", "window", "arm"],
        )
        segment = GaugeMetricFamily(
            names.SEGMENT_SPEEDUP,
            "Speedup of the median in one band of one condition (load, prompt, output,"
            " temperature, category) with its CI bounds; no series while too little data.",
            labels=["model", "window", "arm", "metric", "dimension", "band", "bound"],
        )
        in_flight = GaugeMetricFamily(
            names.SEGMENT_IN_FLIGHT,
            "Mean calls in flight per engine of a load band's requests (both arms): where its"
            " speedup was measured (speedup vs load).",
            labels=["model", "window", "arm", "metric", "band"],
        )
        crossover = GaugeMetricFamily(
            names.CROSSOVER_LOAD,
            "Calls in flight per engine at which the speedup crosses 1, with its CI bounds;"
            " no series beyond the observed range.",
            labels=["model", "window", "arm", "metric", "bound"],
        )
        last_run = GaugeMetricFamily(names.STATS_LAST_RUN, "Unix time the stats job last finished.")
        data_lag = GaugeMetricFamily(
            names.STATS_DATA_LAG,
            "Age of the newest data the last stats result saw, at the time it was computed.",
        )
        ramp_step = GaugeMetricFamily(
            names.RAMP_STEP,
            "Step of the guarded ramp's schedule each ramped treatment arm is at (1-based; 0: cut"
            " by a guard, or set off the schedule), as of the ramp's move before the last tick.",
            labels=["arm"],
        )
        ramp_moves = CounterMetricFamily(
            names.RAMP_DECISIONS,
            "Moves of the guarded ramp by the current stats leader: start, step (up the"
            " schedule), cut (to 0 on a failing guard); dry_run=true: decided and logged only.",
            labels=["arm", "move", "dry_run"],
        )
        future_rows = GaugeMetricFamily(
            names.STATS_FUTURE_ROWS,
            "Usable requests the last stats result left out of every window for a timestamp"
            " more than stats.future_skew_s after now (a clock stepped back, or a replica's"
            " clock runs fast on the shared store).",
        )
        is_leader = self._leader() if self._leader is not None else None
        if is_leader is not None:
            leader = GaugeMetricFamily(
                names.STATS_LEADER,
                "1 in the process that computes the stats (the elected leader), 0 elsewhere.",
            )
            leader.add_metric([], 1.0 if is_leader else 0.0)
            yield leader
        families = _Families(verdict, gate, slowdown, speedup, tokens_per_step, break_even)
        result = self._latest()
        if result is not None:
            last_run.add_metric([], float(result["computed_at"]))
            for arm, status in result.get("ramp", {}).items():
                ramp_step.add_metric([arm], float(status["step"]))
                dry = "true" if status["dry_run"] else "false"
                for move in names.RAMP_MOVES:
                    ramp_moves.add_metric([arm, move, dry], float(status["moves"].get(move, 0)))
            lag = result.get("lag_s")
            if lag is not None:
                data_lag.add_metric([], float(lag))
            future_rows.add_metric([], float(result.get("future_rows", 0)))
            for model, windows in result["results"].items():
                for window, res in windows.items():
                    counts: dict[str, int] = {}
                    for arm, comparison in comparisons_of(res).items():
                        counts.update(comparison["samples"])
                        _add_comparison([model, window, arm], comparison, families)
                        found = cast(Mapping[str, Any], comparison).get("conditions")
                        _conditions(segment, in_flight, crossover, [model, window, arm], found)
                    for arm, n in counts.items():
                        samples.add_metric([model, window, arm], float(n))
        yield from (speedup, samples, verdict, gate, slowdown, tokens_per_step, break_even)
        yield from (segment, in_flight, crossover, last_run, data_lag, future_rows)
        yield from (ramp_step, ramp_moves)


def _conditions(
    segment: GaugeMetricFamily,
    in_flight: GaugeMetricFamily,
    crossover: GaugeMetricFamily,
    key: list[str],
    conditions: Conditions | None,
) -> None:
    """One treatment's band speedups, its load bands' loads and its crossover; `key` = [model,
    window, arm]."""
    if conditions is None:
        return
    for dimension, per_metric in conditions["segments"].items():
        for metric, bands in per_metric.items():
            for band in bands:
                load = band.get("load")
                if load is not None and band["speedup"] is not None:
                    in_flight.add_metric([*key, metric, band["band"]], load)
                for bound, value in (
                    ("estimate", band["speedup"]),
                    ("lower", band["lower"]),
                    ("upper", band["upper"]),
                ):
                    if value is not None:
                        segment.add_metric([*key, metric, dimension, band["band"], bound], value)
    for metric, found in conditions["crossover"].items():
        for bound, value in (
            ("estimate", found["load"]),
            ("lower", found["lower"]),
            ("upper", found["upper"]),
        ):
            if value is not None:
                crossover.add_metric([*key, metric, bound], value)


class _Families(NamedTuple):
    verdict: StateSetMetricFamily
    gate: StateSetMetricFamily
    slowdown: GaugeMetricFamily
    speedup: GaugeMetricFamily
    tokens_per_step: GaugeMetricFamily
    break_even: GaugeMetricFamily


def _add_comparison(key: list[str], res: Mapping[str, Any], f: _Families) -> None:
    """One treatment's comparison series; `key` = [model, window, arm]."""
    window_gate = res.get("gate")
    if window_gate is not None:
        state = window_gate["state"]
        f.gate.add_metric(key, {s: s == state for s in names.GATE_STATES})
    check = res["diagnosis"].get("acceptance")
    if check is not None:
        f.tokens_per_step.add_metric(key, check["tokens_per_step"])
        f.break_even.add_metric(key, check["break_even_tokens_per_step"])
    for metric, block in res["metrics"].items():
        labels = [*key, metric]
        f.verdict.add_metric(labels, {s: s == block["verdict"] for s in names.VERDICT_STATES})
        seq = block["sequential"]
        slower = seq is not None and seq["p99_slower"]
        f.slowdown.add_metric(labels, 1.0 if slower else 0.0)
        for stat, ci in block["speedup"].items():
            for bound in ("estimate", "lower", "upper"):
                value = ci[bound]
                if value is not None:
                    f.speedup.add_metric([*labels, stat, bound], value)


def register_stats_collector(
    registry: CollectorRegistry,
    latest: Callable[[], StatsResult | None],
    leader: Callable[[], bool | None] | None = None,
) -> StatsCollector:
    """Create the collector on the injected registry (never the global one)."""
    collector = StatsCollector(latest, leader)
    registry.register(collector)
    return collector
