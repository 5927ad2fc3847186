"""The specproxy Grafana dashboard, generated from the metric-name constants of `specproxy.metrics`.

Built from plain dicts rather than grafana-foundation-sdk: the dashboard JSON model is the
contract Grafana documents and stores, so writing it directly keeps the committed
`dashboards/specproxy.json` reviewable line by line against that model, adds no runtime
dependency (the SDK ships a large generated builder API, versioned by Grafana release, for the
few dozen keys we use), and keeps mypy --strict meaningful without stubs. The PromQL is built
only from the constants the proxy exports, so a renamed metric breaks the generator's test
instead of silently emptying a panel.

Conventions (issue 16), each checked in tests/grafana/test_dashboard.py:
- every panel has a unit, and every latency panel shows the mean beside its percentiles;
- fleet-wide aggregation: rates are summed, quantiles come from `histogram_quantile` over
  buckets summed across proxies, and the stats job's gauges (identical on every replica, the
  leader's result) are read through `max without (instance, pod)`;
- `$model` filters every request and stats query. The variable lists the stats job's models;
  "All" is the stats job's all-models aggregate (`model="all"`, matched as `(?i)All`) and every
  model for the proxy's histograms (allValue `.*`). Engine and process series are per engine or
  per proxy, not per model, and say so. `$instance` drills into one proxy's own series;
- streamed and non-streamed requests are never in one quantile: the request-duration quantiles
  are split by `stream`, and TTFT / TPOT / event gaps exist only for streamed requests;
- the recording rules of deploy/prometheus/rules are used where they exist (request rate,
  failed ratio, tokens per event, the histogram P99 ratio): fleet-wide 5-minute series.

`schemaVersion` 39 is read by every Grafana from 10.4 on; newer ones migrate it forward on load.
Pure: no I/O here (see `specproxy.grafana.cli` for export and push).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from specproxy import metrics as m
from specproxy.stats.result import METRICS, STATISTICS

__all__ = [
    "DASHBOARD_FILENAME",
    "DASHBOARD_UID",
    "SCHEMA_VERSION",
    "build_dashboard",
    "dashboard_json",
    "panel_queries",
]

Json = dict[str, Any]

DASHBOARD_UID = "specproxy-ab"
DASHBOARD_FILENAME = "specproxy.json"
SCHEMA_VERSION = 39
# The compared metrics and the statistics: the stats result's own lists (`stats.result`).
COMPARED_METRICS = tuple((name, spec.title) for name, spec in METRICS.items())
QUANTILES = (0.5, 0.9, 0.99)

DATASOURCE: Json = {"type": "prometheus", "uid": "${datasource}"}
RATE = "$__rate_interval"
# The stats job's series: "All" is its model="all" aggregate, hence the case-insensitive match.
STATS_SELECTOR = 'model=~"(?i)${model:text}",window="$window",arm=~"$arm"'
# A/B/n: the treatments compared with the control (the stats series' `arm`), all by default.
# The proxy's own request series: one model, or all of them; one proxy, or all of them.
REQUEST_SELECTOR = 'model=~"$model",instance=~"$instance"'
INSTANCE_SELECTOR = 'instance=~"$instance"'
FLEET = "without (instance, pod)"
ARM_COLORS = {"speculative": "blue", "baseline": "orange"}


@dataclass
class _Query:
    expr: str
    legend: str
    instant: bool = False

    def target(self, ref_id: str) -> Json:
        return {
            "datasource": DATASOURCE,
            "editorMode": "code",
            "expr": self.expr,
            "format": "table" if self.instant else "time_series",
            "instant": self.instant,
            "legendFormat": self.legend,
            "range": not self.instant,
            "refId": ref_id,
        }


@dataclass
class _Panel:
    kind: str
    title: str
    description: str
    queries: Sequence[_Query]
    unit: str = "short"
    width: int = 12
    height: int = 8
    defaults: Json = field(default_factory=dict)
    overrides: list[Json] = field(default_factory=list)
    options: Json = field(default_factory=dict)
    transformations: list[Json] = field(default_factory=list)

    def render(self, panel_id: int, x: int, y: int) -> Json:
        panel: Json = {
            "datasource": DATASOURCE,
            "description": self.description,
            "fieldConfig": {
                "defaults": {"unit": self.unit, **self.defaults},
                "overrides": self.overrides,
            },
            "gridPos": {"h": self.height, "w": self.width, "x": x, "y": y},
            "id": panel_id,
            "options": self.options,
            "targets": [q.target(chr(ord("A") + i)) for i, q in enumerate(self.queries)],
            "title": self.title,
            "type": self.kind,
        }
        if self.transformations:
            panel["transformations"] = self.transformations
        return panel


# --- PromQL helpers -------------------------------------------------------------------------


def _quantile(metric: str, q: float, by: str = "arm", selector: str = REQUEST_SELECTOR) -> str:
    return (
        f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}_bucket{{{selector}}}[{RATE}])))"
    )


def _mean(metric: str, by: str = "arm", selector: str = REQUEST_SELECTOR) -> str:
    return (
        f"sum by ({by}) (rate({metric}_sum{{{selector}}}[{RATE}]))"
        f" / sum by ({by}) (rate({metric}_count{{{selector}}}[{RATE}]))"
    )


def _stats(name: str, selector: str = STATS_SELECTOR) -> str:
    """A stats-job gauge, once per fleet: every replica serves the leader's identical result."""
    return f"max {FLEET} ({name}{{{selector}}})"


def _engine(name: str) -> str:
    """An engine gauge: every proxy scrapes the same engines, so take one value per arm."""
    return f"max by (arm) ({name})"


def _verdict_value(selector: str) -> str:
    """The verdict state set as one number per metric: 1 faster, 0 inconclusive, -1 slower."""
    state = f"{m.VERDICT}{{{selector},{m.VERDICT}"
    return f'max by (metric) ({state}="faster"}}) - max by (metric) ({state}="slower"}})'


def _quantile_queries(metric: str, by: str = "arm") -> list[_Query]:
    """p50 / p90 / p99 and the mean, one line each per `by` group."""
    legend = " ".join(f"{{{{{label.strip()}}}}}" for label in by.split(","))
    return [
        *(_Query(_quantile(metric, q, by), f"{legend} p{round(q * 100)}") for q in QUANTILES),
        _Query(_mean(metric, by), f"{legend} mean"),
    ]


# --- field config helpers -------------------------------------------------------------------


def _timeseries(**custom: Any) -> Json:
    return {
        "custom": {
            "drawStyle": "line",
            "fillOpacity": 0,
            "lineWidth": 1,
            "showPoints": "never",
            "spanNulls": False,
            **custom,
        }
    }


def _arm_colors() -> list[Json]:
    return [
        {
            "matcher": {"id": "byRegexp", "options": f"^{arm}.*"},
            "properties": [{"id": "color", "value": {"fixedColor": color, "mode": "fixed"}}],
        }
        for arm, color in ARM_COLORS.items()
    ]


def _right_axis(series: str, unit: str) -> Json:
    """Series matching the regex `series` on a right-hand axis in their own `unit`."""
    return {
        "matcher": {"id": "byRegexp", "options": series},
        "properties": [
            {"id": "unit", "value": unit},
            {"id": "custom.axisPlacement", "value": "right"},
        ],
    }


def _legend_options(*calcs: str) -> Json:
    return {
        "legend": {
            "calcs": list(calcs),
            "displayMode": "table" if calcs else "list",
            "placement": "bottom",
            "showLegend": True,
        },
        "tooltip": {"mode": "multi", "sort": "desc"},
    }


def _stat_options(text_mode: str = "value_and_name") -> Json:
    return {
        "colorMode": "background",
        "graphMode": "none",
        "justifyMode": "auto",
        "orientation": "auto",
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "textMode": text_mode,
    }


def _thresholds(*steps: tuple[float | None, str]) -> Json:
    return {
        "mode": "absolute",
        "steps": [{"color": color, "value": value} for value, color in steps],
    }


def _value_mapping(values: dict[str, tuple[str, str]]) -> list[Json]:
    options = {
        key: {"color": color, "index": i, "text": text}
        for i, (key, (text, color)) in enumerate(values.items())
    }
    return [{"options": options, "type": "value"}]


# --- panels ---------------------------------------------------------------------------------


def _verdict_panels() -> list[_Panel]:
    verdict = _Panel(
        "stat",
        "Verdict ($arm against the control)",
        "Anytime-valid verdict per compared metric in the selected window, for the treatment"
        " this row repeats for (one row per selected treatment): slower when the"
        " treatment's median or its P99 (beyond the tolerance) is confidently higher, else"
        " faster when its median or its P99 (beyond the tolerance) is confidently lower,"
        " otherwise inconclusive. specproxy_verdict is a state set; this panel shows it as"
        " 1 faster, 0 inconclusive, -1 slower.",
        [_Query(_verdict_value(STATS_SELECTOR), "{{metric}}")],
        unit="none",
        width=8,
        height=5,
        defaults={
            "color": {"mode": "thresholds"},
            "mappings": _value_mapping(
                {"1": ("faster", "green"), "0": ("inconclusive", "yellow"), "-1": ("slower", "red")}
            ),
            "thresholds": _thresholds((None, "red"), (0, "yellow"), (1, "green")),
        },
        options=_stat_options(),
    )
    slowdown = _Panel(
        "stat",
        "P99 slowdown test (anytime-valid)",
        "1 while the P99 verdict is slower: one of its two anytime-valid tests (the union"
        " bound of per-arm confidence sequences; on split traffic the per-minute exceedance"
        " e-process, valid under load waves, on mirrored pairs the two-sample e-process; each"
        " at alpha/2)"
        " rejects 'speculative P99 is no slower than baseline P99 (within tolerance)' and"
        " neither finds it faster. Safe to watch continuously: the error rate holds at any"
        " look. On the whole-run window a rejection is kept.",
        [_Query(_stats(m.P99_SLOWDOWN), "{{metric}}")],
        unit="bool",
        width=8,
        height=5,
        defaults={
            "color": {"mode": "thresholds"},
            "mappings": _value_mapping({"1": ("P99 slower", "red"), "0": ("no evidence", "green")}),
            "thresholds": _thresholds((None, "green"), (1, "red")),
        },
        options=_stat_options(),
    )
    return [verdict, slowdown]


def _overview_panels() -> list[_Panel]:
    """Every treatment at once: the stats job's age and each treatment's speedups with CIs."""
    stats_age = _Panel(
        "stat",
        "Stats job age",
        "Seconds since the stats job last published (the newest result across replicas)."
        " Verdicts and the P99 test freeze when this grows.",
        [_Query(f"time() - max({m.STATS_LAST_RUN})", "age")],
        unit="s",
        width=8,
        height=5,
        defaults={
            "color": {"mode": "thresholds"},
            "thresholds": _thresholds((None, "green"), (120, "yellow"), (600, "red")),
        },
        options=_stat_options("value"),
    )
    arms = _Panel(
        "table",
        "Arms: role and labels",
        "Every configured arm, its role (control or treatment) and its free-form labels"
        " (`[arms.NAME] labels`, shown as label_KEY), as the proxies export them.",
        [
            _Query(
                f"max without (instance, pod) ({m.ARM}_info{{{INSTANCE_SELECTOR}}})",
                "arms",
                instant=True,
            )
        ],
        unit="none",
        width=16,
        height=5,
        defaults={"custom": {"align": "auto"}},
        options={"cellHeight": "sm", "showHeader": True, "sortBy": [{"displayName": "role"}]},
        transformations=[
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "Value": True, "__name__": True, "job": True},
                    "indexByName": {"arm": 0, "role": 1},
                },
            },
        ],
    )
    bounds = ("estimate", "lower", "upper")
    ci_table = _Panel(
        "table",
        "Speedup with confidence interval, every treatment",
        "Speedup = control / treatment for each selected treatment (`arm`), metric and"
        " statistic (above 1: the treatment is faster), with the bootstrap CI bounds.",
        [
            _Query(
                f"max without (bound, instance, pod)"
                f' ({m.SPEEDUP}{{{STATS_SELECTOR},bound="{bound}"}})',
                bound,
                instant=True,
            )
            for bound in bounds
        ],
        unit="none",
        width=24,
        height=9,
        defaults={
            "custom": {"align": "auto", "cellOptions": {"type": "color-text"}},
            "decimals": 3,
            "thresholds": _thresholds((None, "red"), (1, "green")),
        },
        options={"cellHeight": "sm", "showHeader": True, "sortBy": [{"displayName": "metric"}]},
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True, "job": True},
                    "indexByName": {
                        "arm": 0,
                        "metric": 1,
                        "statistic": 2,
                        "Value #A": 3,
                        "Value #B": 4,
                        "Value #C": 5,
                        "model": 6,
                        "window": 7,
                    },
                    "renameByName": {
                        f"Value #{chr(ord('A') + i)}": bound for i, bound in enumerate(bounds)
                    },
                },
            },
        ],
    )
    return [stats_age, arms, ci_table]


def _speedup_over_time_panels() -> list[_Panel]:
    panels: list[_Panel] = []
    for metric, title in COMPARED_METRICS:
        selector = f'{STATS_SELECTOR},metric="{metric}",statistic="$statistic"'
        panels.append(
            _Panel(
                "timeseries",
                f"Speedup over time: {title} ($statistic)",
                "Estimate with its CI as a band (x: baseline / speculative). The dashed line at"
                " 1 is no change; a band wholly below it means speculation is costing time.",
                [
                    _Query(_stats(m.SPEEDUP, f'{selector},bound="{bound}"'), bound)
                    for bound in ("estimate", "lower", "upper")
                ],
                unit="x",
                width=8,
                defaults={
                    **_timeseries(thresholdsStyle={"mode": "dashed"}),
                    "color": {"fixedColor": "blue", "mode": "fixed"},
                    "thresholds": _thresholds((None, "transparent"), (1, "red")),
                },
                overrides=[
                    {
                        "matcher": {"id": "byName", "options": "upper"},
                        "properties": [
                            {"id": "custom.fillBelowTo", "value": "lower"},
                            {"id": "custom.fillOpacity", "value": 20},
                            {"id": "custom.lineWidth", "value": 0},
                        ],
                    },
                    {
                        "matcher": {"id": "byName", "options": "lower"},
                        "properties": [{"id": "custom.lineWidth", "value": 0}],
                    },
                    {
                        "matcher": {"id": "byName", "options": "estimate"},
                        "properties": [{"id": "custom.lineWidth", "value": 2}],
                    },
                ],
                options=_legend_options(),
            )
        )
    return panels


SEGMENT_DIMENSIONS = ("load", "prompt", "output", "temperature", "category")
# The condition gauges (`stats.segments`) are computed on the whole-run window of all models
# only, so they follow the Treatment variable but not $model / $window.
SEGMENT_SELECTOR = 'arm=~"$arm"'
_BOUNDS = ("estimate", "lower", "upper")


def _bound_table(title: str, description: str, exprs: list[str], unit: str, first: str) -> _Panel:
    """An instant table: one row per series, estimate / lower / upper as columns."""
    return _Panel(
        "table",
        title,
        description,
        [_Query(expr, bound, instant=True) for expr, bound in zip(exprs, _BOUNDS, strict=True)],
        unit=unit,
        width=8,
        height=9,
        defaults={
            "custom": {"align": "auto", "cellOptions": {"type": "color-text"}},
            "decimals": 2,
            "thresholds": _thresholds((None, "red"), (1, "green")),
        },
        options={"cellHeight": "sm", "showHeader": True, "sortBy": [{"displayName": first}]},
        transformations=[
            {"id": "merge", "options": {}},
            {
                "id": "organize",
                "options": {
                    "excludeByName": {"Time": True},
                    "renameByName": {
                        f"Value #{chr(ord('A') + i)}": bound for i, bound in enumerate(_BOUNDS)
                    },
                },
            },
        ],
    )


def _condition_panels() -> list[_Panel]:
    """Issue 26 item 5: the median speedup by band of each condition, and the crossover load."""
    panels = [
        _bound_table(
            f"Speedup by {dimension} band",
            f"Median speedup (control / treatment) in each {dimension} band, per treatment and"
            " compared metric, with its CI bounds (whole-run window, all models). A band with"
            " too little data has no row.",
            [
                f"max by (arm, metric, band) ({m.SEGMENT_SPEEDUP}{{{SEGMENT_SELECTOR},"
                f'dimension="{dimension}",bound="{bound}"}})'
                for bound in _BOUNDS
            ],
            "x",
            "band",
        )
        for dimension in SEGMENT_DIMENSIONS
    ]
    panels.append(
        _bound_table(
            "Crossover load",
            "Calls in flight per engine at which the treatment stops being faster than the"
            " control, per treatment and metric, with its bounds; a bound beyond the observed"
            " range has no value.",
            [
                f'max by (arm, metric) ({m.CROSSOVER_LOAD}{{{SEGMENT_SELECTOR},bound="{bound}"}})'
                for bound in _BOUNDS
            ],
            "suffix: req",
            "arm",
        )
    )
    return panels


def _latency_panels() -> list[_Panel]:
    note = (
        " p50 / p90 / p99 from the proxy's histograms summed over proxies (buckets 26% apart,"
        " P99 within ~8%), and the mean from _sum / _count. The exact comparison with CIs is"
        " in the speedup panels above."
    )
    duration = _Panel(
        "timeseries",
        "End-to-end latency by arm, streamed and not apart",
        "Request duration, one set of lines per arm and `stream` (true / false): a long"
        " non-streamed answer and a streamed one are never in one quantile." + note,
        _quantile_queries(m.REQUEST_DURATION, "arm, stream"),
        unit="s",
        defaults=_timeseries(),
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "max"),
    )
    streamed = [
        (m.TTFT, "Time to first token by arm (streamed requests)"),
        (m.TPOT, "Time per output token by arm (streamed requests)"),
        (m.EVENT_GAP, "Gap between SSE events by arm (streamed; one engine step)"),
    ]
    return [
        duration,
        *(
            _Panel(
                "timeseries",
                title,
                "Only streamed requests have these." + note,
                _quantile_queries(metric),
                unit="s",
                defaults=_timeseries(),
                overrides=_arm_colors(),
                options=_legend_options("lastNotNull", "max"),
            )
            for metric, title in streamed
        ),
    ]


def _speculation_panels() -> list[_Panel]:
    tokens_per_event = _Panel(
        "timeseries",
        "Tokens per SSE event",
        "Output tokens per streamed event (recording rule, fleet-wide, 5 m mean). Each event is"
        " one engine step, so above 1 on the speculative arm means draft tokens are being"
        " accepted; about 1 means they are not.",
        [
            _Query(
                f'{m.RECORDED_TOKENS_PER_EVENT}{{model=~"$model"}}', "{{arm}} {{model}} mean 5m"
            ),
            _Query(_quantile(m.TOKENS_PER_EVENT, 0.5), "{{arm}} p50"),
        ],
        unit="suffix: tok",
        defaults=_timeseries(),
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "mean"),
    )
    acceptance_rate = _Panel(
        "timeseries",
        "Draft acceptance rate",
        "Accepted / drafted tokens, from the speculative engine's /metrics (per engine, not"
        " per model).",
        [_Query(_engine(m.ENGINE_ACCEPTANCE_RATIO), "{{arm}}")],
        unit="percentunit",
        width=6,
        defaults={**_timeseries(), "max": 1, "min": 0},
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull"),
    )
    acceptance_length = _Panel(
        "timeseries",
        "Mean acceptance length",
        "Tokens emitted per speculative step: 1 + accepted / drafts. 1 means no gain.",
        [_Query(_engine(m.ENGINE_MEAN_ACCEPTANCE_LENGTH), "{{arm}}")],
        unit="suffix: tok",
        width=6,
        defaults={**_timeseries(), "min": 1},
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull"),
    )
    per_position = _Panel(
        "bargauge",
        "Acceptance rate by draft position",
        "Share of steps in which the draft token at each position was accepted. It falls with"
        " position; a steep fall says fewer speculative tokens would do.",
        [
            _Query(
                f"max by (position) ({m.ENGINE_POSITION_ACCEPTANCE_RATIO})",
                "position {{position}}",
                instant=True,
            )
        ],
        unit="percentunit",
        defaults={
            "color": {"mode": "continuous-RdYlGr"},
            "max": 1,
            "min": 0,
        },
        options={
            "displayMode": "gradient",
            "orientation": "horizontal",
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "showUnfilled": True,
        },
    )
    return [tokens_per_event, acceptance_rate, acceptance_length, per_position]


def _engine_panels() -> list[_Panel]:
    up = _Panel(
        "stat",
        "Engines up",
        "Engine endpoints whose last /metrics scrape succeeded, of those each arm has (any"
        " proxy that reaches it counts it up).",
        [
            _Query(f"sum by (arm) (max by (arm, endpoint) ({m.ENGINE_UP}))", "{{arm}} up"),
            _Query(f"count by (arm) (max by (arm, endpoint) ({m.ENGINE_UP}))", "{{arm}} of"),
        ],
        unit="none",
        width=6,
        defaults={
            "color": {"mode": "thresholds"},
            "thresholds": _thresholds((None, "red"), (1, "green")),
        },
        options=_stat_options(),
    )
    restarts = _Panel(
        "timeseries",
        "Engine restarts",
        "Restarts the scraper detected per arm in each interval. Requests just after one are"
        " warm-up and left out of the comparison.",
        [_Query(f"max by (arm) (increase({m.ENGINE_RESTARTS}_total[{RATE}]))", "{{arm}} restarts")],
        unit="suffix: restarts",
        width=6,
        defaults=_timeseries(drawStyle="bars", fillOpacity=60),
        overrides=_arm_colors(),
        options=_legend_options("sum"),
    )
    load = _Panel(
        "timeseries",
        "Engine load: running and waiting requests",
        "Speculation pays at low batch sizes; a speedup that fades as running grows is the"
        " expected failure mode, and waiting > 0 means the engine is saturated.",
        [
            _Query(_engine(m.ENGINE_REQUESTS_RUNNING), "{{arm}} running"),
            _Query(_engine(m.ENGINE_REQUESTS_WAITING), "{{arm}} waiting"),
        ],
        unit="suffix: req",
        width=12,
        defaults=_timeseries(),
        overrides=[
            *_arm_colors(),
            {
                "matcher": {"id": "byRegexp", "options": ".* waiting"},
                "properties": [
                    {"id": "custom.lineStyle", "value": {"dash": [10, 10], "fill": "dash"}}
                ],
            },
        ],
        options=_legend_options("lastNotNull", "max"),
    )
    kv_cache = _Panel(
        "timeseries",
        "KV cache usage",
        "Fraction of the KV cache in use. Draft tokens take KV space too; near 1 the engine"
        " preempts requests.",
        [_Query(_engine(m.ENGINE_KV_CACHE_USAGE), "{{arm}}")],
        unit="percentunit",
        width=8,
        defaults={**_timeseries(), "max": 1, "min": 0},
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "max"),
    )
    throughput = _Panel(
        "timeseries",
        "Generation throughput",
        "Output tokens per second generated by each arm's engines: rate() of each engine's own"
        " counter, one copy per endpoint (every proxy exports the same), summed over endpoints.",
        [
            _Query(
                f"sum by (arm) (max by (arm, endpoint)"
                f" (rate({m.ENGINE_GENERATION_TOKENS}_total[{RATE}])))",
                "{{arm}}",
            )
        ],
        unit="suffix: tok/s",
        width=8,
        defaults=_timeseries(),
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "mean"),
    )
    output_length = _Panel(
        "timeseries",
        "Output length by arm",
        "Output tokens per request: p50 / p90 / p99 and the mean. Both arms should match (the"
        " same prompts, lossless speculation); if they do not, latency per request is not"
        " comparable and TPOT is the fairer metric.",
        _quantile_queries(m.OUTPUT_TOKENS),
        unit="suffix: tok",
        width=8,
        defaults=_timeseries(),
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "mean"),
    )
    return [up, restarts, load, kv_cache, throughput, output_length]


def _gpu_panels() -> list[_Panel]:
    """The optional dcgm-exporter telemetry (`scrape.dcgm`): empty without `dcgm_urls`."""
    bandwidth = _Panel(
        "timeseries",
        "GPU memory bandwidth (busiest GPU)",
        "Share of cycles the busiest GPU's memory interface is active (DCGM_FI_PROF_DRAM_ACTIVE,"
        " else memory copy utilisation). Above 90 % (dashed) decoding is memory bound and"
        " speculation's verification work competes for the bandwidth.",
        [_Query(_engine(m.GPU_MEMORY_BANDWIDTH_RATIO), "{{arm}}")],
        unit="percentunit",
        width=8,
        defaults={
            **_timeseries(thresholdsStyle={"mode": "dashed"}),
            "max": 1,
            "min": 0,
            "thresholds": _thresholds((None, "transparent"), (0.9, "red")),
        },
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "max"),
    )
    clocks = _Panel(
        "timeseries",
        "GPU SM clock and thermal throttling",
        "Mean SM clock of each arm's GPUs; bars mark scrapes where a GPU had its clocks cut for"
        " a thermal reason (SW/HW thermal slowdown, HW slowdown). A throttled arm is slower for"
        " reasons unrelated to speculation: its comparison is confounded.",
        [
            _Query(_engine(m.GPU_SM_CLOCK), "{{arm}} SM clock"),
            _Query(_engine(m.GPU_THERMAL_THROTTLED), "{{arm}} thermal throttled"),
        ],
        unit="hertz",
        width=8,
        defaults=_timeseries(),
        overrides=[
            *_arm_colors(),
            {
                "matcher": {"id": "byRegexp", "options": ".* thermal throttled"},
                "properties": [
                    {"id": "unit", "value": "bool_yes_no"},
                    {"id": "custom.axisPlacement", "value": "right"},
                    {"id": "custom.drawStyle", "value": "bars"},
                    {"id": "custom.fillOpacity", "value": 40},
                ],
            },
        ],
        options=_legend_options("lastNotNull", "min"),
    )
    utilization = _Panel(
        "timeseries",
        "GPU utilisation and temperature",
        "Mean GPU utilisation of each arm (left) and its hottest GPU's temperature (right).",
        [
            _Query(_engine(m.GPU_UTILIZATION_RATIO), "{{arm}} utilisation"),
            _Query(_engine(m.GPU_TEMPERATURE), "{{arm}} temperature"),
        ],
        unit="percentunit",
        width=8,
        defaults=_timeseries(),
        overrides=[
            *_arm_colors(),
            {
                "matcher": {"id": "byRegexp", "options": ".* temperature"},
                "properties": [
                    {"id": "unit", "value": "celsius"},
                    {"id": "custom.axisPlacement", "value": "right"},
                ],
            },
        ],
        options=_legend_options("lastNotNull", "max"),
    )
    return [bandwidth, clocks, utilization]


def _traffic_panels() -> list[_Panel]:
    samples = _Panel(
        "timeseries",
        "Samples per arm",
        "Requests the stats job compared in the selected window. Tail statistics (p99) need"
        " thousands per arm before their CIs get narrow.",
        [_Query(_stats(m.SAMPLES), "{{arm}}")],
        unit="suffix: req",
        width=8,
        defaults=_timeseries(),
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull"),
    )
    requests = _Panel(
        "timeseries",
        "Requests by arm",
        "Requests per second (recording rule, fleet-wide, 5 m), and requests in flight now.",
        [
            _Query(f'sum by (arm) ({m.RECORDED_REQUEST_RATE}{{model=~"$model"}})', "{{arm}} req/s"),
            _Query(f"sum by (arm) ({m.INFLIGHT}{{{INSTANCE_SELECTOR}}})", "{{arm}} in flight"),
        ],
        unit="reqps",
        width=8,
        defaults=_timeseries(),
        overrides=[
            *_arm_colors(),
            _right_axis(".* in flight", "suffix: req"),
        ],
        options=_legend_options("lastNotNull", "mean"),
    )
    errors = _Panel(
        "timeseries",
        "Errors by arm",
        "Failed share of requests (recording rule, fleet-wide, 5 m) and upstream failures"
        f" per second by kind ({', '.join(m.UPSTREAM_ERROR_KINDS)}).",
        [
            _Query(
                f'{m.RECORDED_FAILED_RATIO}{{model=~"$model"}}', "{{arm}} {{model}} failed share"
            ),
            _Query(
                f"sum by (arm, kind) (rate({m.UPSTREAM_ERRORS}_total{{{INSTANCE_SELECTOR}}}"
                f"[{RATE}]))",
                "{{arm}} upstream {{kind}}",
            ),
        ],
        unit="percentunit",
        width=8,
        defaults=_timeseries(drawStyle="bars", fillOpacity=60),
        overrides=[
            *_arm_colors(),
            _right_axis(".* upstream .*", "reqps"),
        ],
        options=_legend_options("lastNotNull", "max"),
    )
    p99_ratio = _Panel(
        "timeseries",
        "P99 ratio from histograms (treatment / control)",
        "Recording rule, fleet-wide, 5 m, streamed and non-streamed requests together: a"
        " coarse cross-check of the stats job's P99 speedup, one line per treatment arm (no CI;"
        " above 1 the treatment's tail is slower than the control's).",
        [
            _Query(
                f'{m.RECORDED_P99_RATIO}{{model=~"$model",arm=~"$arm"}}',
                "{{arm}} {{model}} p99 ratio",
            )
        ],
        unit="x",
        width=8,
        defaults={
            **_timeseries(thresholdsStyle={"mode": "dashed"}),
            "thresholds": _thresholds((None, "transparent"), (1, "red")),
        },
        options=_legend_options("lastNotNull", "max"),
    )
    overhead = _Panel(
        "timeseries",
        "Proxy overhead",
        "End-to-end time minus upstream time: what specproxy itself adds to each request.",
        [
            _Query(_quantile(m.PROXY_OVERHEAD, 0.5, selector=INSTANCE_SELECTOR), "{{arm}} p50"),
            _Query(_quantile(m.PROXY_OVERHEAD, 0.99, selector=INSTANCE_SELECTOR), "{{arm}} p99"),
            _Query(_mean(m.PROXY_OVERHEAD, selector=INSTANCE_SELECTOR), "{{arm}} mean"),
        ],
        unit="s",
        width=8,
        defaults=_timeseries(),
        overrides=_arm_colors(),
        options=_legend_options("lastNotNull", "max"),
    )
    store = _Panel(
        "timeseries",
        "Record store",
        "Records waiting to be written, and records dropped (must stay 0: a dropped record"
        " biases every statistic), per proxy.",
        [
            _Query(f"{m.STORE_PENDING}{{{INSTANCE_SELECTOR}}}", "{{instance}} pending"),
            _Query(
                f"rate({m.STORE_DROPPED}_total{{{INSTANCE_SELECTOR}}}[{RATE}])",
                "{{instance}} dropped/s",
            ),
        ],
        unit="suffix: rec",
        width=8,
        defaults=_timeseries(),
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".* dropped/s"},
                "properties": [
                    {"id": "color", "value": {"fixedColor": "red", "mode": "fixed"}},
                    {"id": "unit", "value": "suffix: rec/s"},
                    {"id": "custom.axisPlacement", "value": "right"},
                ],
            }
        ],
        options=_legend_options("lastNotNull", "max"),
    )
    process = _Panel(
        "timeseries",
        "Proxy CPU and memory",
        "Each proxy's own process: CPU seconds per second and resident memory.",
        [
            _Query(
                f"rate(process_cpu_seconds_total{{{INSTANCE_SELECTOR}}}[{RATE}])",
                "{{instance}} CPU",
            ),
            _Query(f"process_resident_memory_bytes{{{INSTANCE_SELECTOR}}}", "{{instance}} memory"),
        ],
        unit="percentunit",
        width=8,
        defaults=_timeseries(),
        overrides=[
            {
                "matcher": {"id": "byRegexp", "options": ".* memory"},
                "properties": [
                    {"id": "unit", "value": "bytes"},
                    {"id": "custom.axisPlacement", "value": "right"},
                ],
            }
        ],
        options=_legend_options("lastNotNull", "max"),
    )
    arms = _Panel(
        "timeseries",
        "Arm shares and the kill switch",
        "The share of the traffic each arm gets now (runtime arm control: `specproxy arms`),"
        " and 1 while the experiment is stopped. Every proxy applies a change within one"
        " [control] poll_s; the largest value over the selected proxies is shown.",
        [
            _Query(f"max by (arm) ({m.ARM_WEIGHT}{{{INSTANCE_SELECTOR}}})", "{{arm}}"),
            _Query(f"max({m.EXPERIMENT_STOPPED}{{{INSTANCE_SELECTOR}}})", "stopped"),
        ],
        unit="percentunit",
        width=8,
        defaults=_timeseries(),
        overrides=[
            *_arm_colors(),
            {
                "matcher": {"id": "byName", "options": "stopped"},
                "properties": [
                    {"id": "color", "value": {"fixedColor": "red", "mode": "fixed"}},
                    {"id": "unit", "value": "bool_on_off"},
                    {"id": "custom.axisPlacement", "value": "right"},
                ],
            },
        ],
        options=_legend_options("lastNotNull"),
    )
    return [samples, requests, errors, p99_ratio, overhead, store, process, arms]


# Annotations marking runtime changes of the split: any proxy's gauge changed within the window
# (twice the step, so a change between two steps is never missed).
ARM_ANNOTATIONS: tuple[tuple[str, str, str, str], ...] = (
    (
        "arm weight changes",
        f"max by (arm) (changes({m.ARM_WEIGHT}{{{INSTANCE_SELECTOR}}}[2m])) > 0",
        "purple",
        "{{arm}}'s share changed",
    ),
    (
        "experiment stopped or started",
        f"max(changes({m.EXPERIMENT_STOPPED}{{{INSTANCE_SELECTOR}}}[2m])) > 0",
        "red",
        "experiment stopped or started",
    ),
)


def _arm_annotations() -> list[Json]:
    return [
        {
            "datasource": DATASOURCE,
            "enable": True,
            "expr": expr,
            "iconColor": color,
            "name": name,
            "step": "60s",
            "tagKeys": "arm",
            "textFormat": title,
            "titleFormat": title,
            "useValueForTime": False,
        }
        for name, expr, color, title in ARM_ANNOTATIONS
    ]


# (title, panels, the variable the row repeats for): Grafana repeats a row and its panels once
# per selected value, with the variable set to that one value.
ROWS: tuple[tuple[str, Callable[[], list[_Panel]], str | None], ...] = (
    ("Overview: every treatment against the control", _overview_panels, None),
    ("Verdict: $arm", _verdict_panels, "arm"),
    ("Speedup over time", _speedup_over_time_panels, None),
    ("Speedup by condition", _condition_panels, None),
    ("Latency by arm", _latency_panels, None),
    ("Speculative decoding", _speculation_panels, None),
    ("Engines", _engine_panels, None),
    ("GPU telemetry (optional: dcgm-exporter)", _gpu_panels, None),
    ("Traffic, errors and the proxy itself", _traffic_panels, None),
)


def _layout() -> Iterator[Json]:
    """Rows of panels, each panel placed left to right and wrapped at Grafana's 24 columns."""
    panel_id = 1
    y = 0
    for title, build, repeat in ROWS:
        yield {
            "collapsed": False,
            "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            "id": panel_id,
            "panels": [],
            "title": title,
            "type": "row",
            **({"repeat": repeat} if repeat is not None else {}),
        }
        panel_id += 1
        y += 1
        x = 0
        row_height = 0
        for panel in build():
            if x + panel.width > 24:
                x, y, row_height = 0, y + row_height, 0
            yield panel.render(panel_id, x, y)
            panel_id += 1
            x += panel.width
            row_height = max(row_height, panel.height)
        y += row_height


def _query_variable(name: str, label: str, query: str) -> Json:
    return {
        "current": {},
        "datasource": DATASOURCE,
        "definition": query,
        "hide": 0,
        "includeAll": False,
        "label": label,
        "multi": False,
        "name": name,
        "options": [],
        "query": {
            "qryType": 1,
            "query": query,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
        },
        "refresh": 2,
        "regex": "",
        "skipUrlSync": False,
        "sort": 1,
        "type": "query",
    }


def _templating() -> list[Json]:
    statistic_default = STATISTICS[0]
    return [
        {
            "current": {},
            "hide": 0,
            "includeAll": False,
            "label": "Data source",
            "multi": False,
            "name": "datasource",
            "options": [],
            "query": "prometheus",
            "refresh": 1,
            "regex": "",
            "skipUrlSync": False,
            "type": "datasource",
        },
        {
            **_query_variable("model", "Model", f"label_values({m.SPEEDUP}, model)"),
            # the stats job's all-models entry is the "All" option, not a model of its own
            "regex": "/^(?!all$).*/",
            "includeAll": True,
            "allValue": ".*",
            "current": {"selected": True, "text": "All", "value": "$__all"},
        },
        _query_variable(
            "window",
            "Window",
            f"label_values({m.SPEEDUP}{{{STATS_SELECTOR.split(',')[0]}}}, window)",
        ),
        {
            **_query_variable("arm", "Treatment", f"label_values({m.SPEEDUP}, arm)"),
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"selected": True, "text": "All", "value": "$__all"},
        },
        {
            **_query_variable("instance", "Proxy", f"label_values({m.BUILD}_info, instance)"),
            "includeAll": True,
            "multi": True,
            "allValue": ".*",
            "current": {"selected": True, "text": "All", "value": "$__all"},
        },
        {
            "current": {"selected": True, "text": statistic_default, "value": statistic_default},
            "hide": 0,
            "includeAll": False,
            "label": "Statistic",
            "multi": False,
            "name": "statistic",
            "options": [
                {"selected": s == statistic_default, "text": s, "value": s} for s in STATISTICS
            ],
            "query": ",".join(STATISTICS),
            "skipUrlSync": False,
            "type": "custom",
        },
    ]


def build_dashboard() -> Json:
    """The whole dashboard as Grafana's JSON model (what `dashboards/specproxy.json` holds)."""
    return {
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                },
                {
                    "datasource": DATASOURCE,
                    "enable": True,
                    "expr": 'ALERTS{alertname=~"SpecProxy.*", alertstate="firing"}',
                    "iconColor": "red",
                    "name": "specproxy alerts",
                    "step": "60s",
                    "tagKeys": "alertname,metric,arm",
                    "textFormat": "{{alertname}}",
                    "titleFormat": "{{alertname}}",
                    "useValueForTime": False,
                },
                *_arm_annotations(),
            ]
        },
        "description": "Speculative-decoding A/B comparison through specproxy: verdicts and"
        " speedups with CIs from raw per-request records, latency by arm, acceptance, engine"
        " load, and the proxy's own health.",
        "editable": True,
        "fiscalYearStartMonth": 0,
        "graphTooltip": 1,
        "id": None,
        "links": [],
        "panels": list(_layout()),
        "refresh": "30s",
        "schemaVersion": SCHEMA_VERSION,
        "tags": ["specproxy", "speculative-decoding", "vllm"],
        "templating": {"list": _templating()},
        "time": {"from": "now-1h", "to": "now"},
        "timepicker": {},
        "timezone": "browser",
        "title": "specproxy: speculative decoding A/B/n",
        "uid": DASHBOARD_UID,
        "version": 1,
        "weekStart": "",
    }


def dashboard_json(dashboard: Json | None = None) -> str:
    """Stable text form: sorted keys and a final newline, so regeneration diffs cleanly."""
    return (
        json.dumps(build_dashboard() if dashboard is None else dashboard, indent=2, sort_keys=True)
        + "\n"
    )


def panel_queries(dashboard: Json) -> list[tuple[str, str, bool]]:
    """(panel title, expr, instant) for every query of every panel, rows included."""
    found: list[tuple[str, str, bool]] = []
    for panel in dashboard["panels"]:
        for inner in [panel, *panel.get("panels", [])]:
            found.extend(
                (inner["title"], target["expr"], bool(target.get("instant")))
                for target in inner.get("targets", [])
            )
    return found
