"""The generated dashboard: committed copy up to date, valid layout, queries on exported names."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.cog.plugins import register_default_plugins
from grafana_foundation_sdk.models.dashboard import Dashboard

from specproxy import metrics as m
from specproxy.grafana.dashboard import (
    DASHBOARD_FILENAME,
    DASHBOARD_UID,
    build_dashboard,
    dashboard_json,
    panel_queries,
)
from tests.deploy.rulefiles import load_rules, promtool
from tests.promql_names import arm_matchers, exported_names, names_in

REPO = Path(__file__).resolve().parents[2]
COMMITTED = REPO / "dashboards" / DASHBOARD_FILENAME


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dashboard["panels"] if p["type"] != "row"]


def test_committed_dashboard_is_the_generated_one() -> None:
    assert COMMITTED.read_text(encoding="utf-8") == dashboard_json(), (
        "dashboards/specproxy.json is stale: run `specproxy dashboards export --out dashboards`"
    )


def test_generation_is_deterministic() -> None:
    assert dashboard_json() == dashboard_json(build_dashboard())
    assert json.loads(dashboard_json()) == build_dashboard()


def test_dashboard_targets_current_grafana_with_required_variables() -> None:
    dashboard = build_dashboard()
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] == DASHBOARD_UID
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert {"datasource", "model", "window", "instance"} <= set(variables)
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    assert m.SPEEDUP in variables["model"]["definition"]
    assert "${model:text}" in variables["window"]["definition"]
    # "All" is every model for the proxy's series, and the stats job's model="all" aggregate
    assert variables["model"]["includeAll"] and variables["model"]["allValue"] == ".*"
    assert variables["instance"]["includeAll"] and variables["instance"]["multi"]


def test_every_panel_uses_the_datasource_variable_and_has_unique_ids() -> None:
    dashboard = build_dashboard()
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in _panels(dashboard):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert all(t["datasource"] == panel["datasource"] for t in panel["targets"])
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids))


def test_panels_fit_the_grid_without_overlapping() -> None:
    occupied: set[tuple[int, int]] = set()
    for panel in build_dashboard()["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells


def _recorded() -> set[str]:
    return {
        rule["record"]
        for group in load_rules()["groups"]
        for rule in group["rules"]
        if "record" in rule
    }


def test_queries_name_only_metrics_the_proxy_exports() -> None:
    allowed = exported_names() | {"ALERTS"} | _recorded()
    queries = panel_queries(build_dashboard())
    assert queries
    for title, expr, _ in queries:
        names = names_in(expr)
        assert names, f"{title}: no metric in {expr!r}"
        assert names <= allowed, f"{title}: unknown {names - allowed} in {expr!r}"


def test_weight_changes_and_stops_are_annotated_from_exported_gauges() -> None:
    annotations = build_dashboard()["annotations"]["list"]
    exprs = {a["name"]: a["expr"] for a in annotations if "expr" in a}
    assert f"changes({m.ARM_WEIGHT}" in exprs["arm weight changes"]
    assert f"changes({m.EXPERIMENT_STOPPED}" in exprs["experiment stopped or started"]
    allowed = exported_names() | {"ALERTS"}
    for name, expr in exprs.items():
        assert names_in(expr) and names_in(expr) <= allowed, name
        assert 'instance=~"$instance"' in expr or name == "specproxy alerts"


def _annotation_test(exprs: dict[str, str]) -> dict[str, Any]:
    """A promtool test of the annotation queries on the gauges two replicas export: the weight
    set 0.5 -> 0.2 at minute 10 (the second replica applies it a poll later, at 11), the
    experiment stopped at minute 20; `$instance` is Grafana's All."""
    series = []
    for i, changed in enumerate((10, 11)):
        instance = f'instance="proxy-{i}"'
        for arm, before, after in (("speculative", 0.5, 0.2), ("baseline", 0.5, 0.8)):
            series.append(
                {
                    "series": f'{m.ARM_WEIGHT}{{arm="{arm}",{instance}}}',
                    "values": f"{before}x{changed - 1} {after}x{40 - changed}",
                }
            )
        series.append({"series": f"{m.EXPERIMENT_STOPPED}{{{instance}}}", "values": "0x19 1x20"})
    weights, stops = exprs["arm weight changes"], exprs["experiment stopped or started"]
    marks = [{"labels": f'{{arm="{arm}"}}', "value": 1} for arm in ("baseline", "speculative")]
    expected = [
        (weights, "5m", []),  # nothing changed: no annotation
        (weights, "10m30s", marks),  # one mark per arm, however many replicas apply it
        (weights, "30m", []),
        (stops, "15m", []),
        (stops, "20m30s", [{"labels": "{}", "value": 1}]),
        (stops, "30m", []),
    ]
    return {
        "interval": "1m",
        "input_series": series,
        "promql_expr_test": [
            {"expr": expr.replace("$instance", ".*"), "eval_time": at, "exp_samples": samples}
            for expr, at, samples in expected
        ],
    }


def test_the_annotations_mark_a_weight_change_and_a_stop_once(tmp_path: Path) -> None:
    annotations = build_dashboard()["annotations"]["list"]
    exprs = {a["name"]: a["expr"] for a in annotations if "expr" in a}
    path = tmp_path / "annotations_test.yml"
    path.write_text(
        yaml.safe_dump({"rule_files": [], "tests": [_annotation_test(exprs)]}), encoding="utf-8"
    )
    result = promtool("test", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    # the check can fail: a query that never fires is reported
    never = {name: expr + " > 1e9" for name, expr in exprs.items()}
    path.write_text(
        yaml.safe_dump({"rule_files": [], "tests": [_annotation_test(never)]}), encoding="utf-8"
    )
    assert promtool("test", "rules", str(path), cwd=tmp_path).returncode != 0


def test_required_panels_are_there() -> None:
    """The issue's panel list, each checked by the metric its query must read."""
    queries = panel_queries(build_dashboard())
    exprs = [expr for _, expr, _ in queries]

    def used(fragment: str) -> bool:
        return any(fragment in expr for expr in exprs)

    assert used(m.VERDICT) and used(m.P99_SLOWDOWN)
    for bound in ("estimate", "lower", "upper"):  # speedup with its CI, and over time
        assert sum(f'bound="{bound}"' in e and m.SPEEDUP in e for e in exprs) >= 4
    assert used(f"histogram_quantile(0.99, sum by (arm, stream, le) (rate({m.REQUEST_DURATION}")
    for histogram in (m.TTFT, m.TPOT, m.OUTPUT_TOKENS):
        assert used(f"histogram_quantile(0.99, sum by (arm, le) (rate({histogram}_bucket"), (
            histogram
        )
    for name in (
        m.TOKENS_PER_EVENT,
        m.ENGINE_ACCEPTANCE_RATIO,
        m.ENGINE_MEAN_ACCEPTANCE_LENGTH,
        m.ENGINE_POSITION_ACCEPTANCE_RATIO,
        m.ENGINE_REQUESTS_RUNNING,
        m.ENGINE_REQUESTS_WAITING,
        m.ENGINE_KV_CACHE_USAGE,
        m.SAMPLES,
        m.UPSTREAM_ERRORS,
        m.PROXY_OVERHEAD,
        m.STORE_DROPPED,
        m.ENGINE_UP,
        m.ENGINE_RESTARTS,
        m.ENGINE_GENERATION_TOKENS,
        m.GPU_MEMORY_BANDWIDTH_RATIO,
        m.GPU_SM_CLOCK,
        m.GPU_THERMAL_THROTTLED,
        m.GPU_UTILIZATION_RATIO,
        m.GPU_TEMPERATURE,
        m.ARM_WEIGHT,
        m.EXPERIMENT_STOPPED,
    ):
        assert used(name), name


def test_stats_queries_follow_the_model_and_window_variables_once_per_fleet() -> None:
    seen = 0
    for title, expr, _ in panel_queries(build_dashboard()):
        if any(name in expr for name in (m.SPEEDUP, m.VERDICT, m.P99_SLOWDOWN, m.SAMPLES)):
            seen += 1
            assert 'model=~"(?i)${model:text}"' in expr and 'window="$window"' in expr, title
            # every replica serves the leader's result: one series, not one per proxy
            assert expr.startswith("max "), (title, expr)
            assert ("instance" in expr and "pod" in expr) or "by (metric)" in expr, (title, expr)
    assert seen >= 8


def test_request_queries_follow_model_and_instance_and_recorded_ones_model() -> None:
    request_metrics = (m.REQUEST_DURATION, m.TTFT, m.TPOT, m.EVENT_GAP, m.OUTPUT_TOKENS)
    for title, expr, _ in panel_queries(build_dashboard()):
        if any(name in expr for name in request_metrics):
            assert 'model=~"$model",instance=~"$instance"' in expr, (title, expr)
        if any(name in expr for name in _recorded()):
            assert 'model=~"$model"' in expr, (title, expr)


def test_no_query_names_an_arm() -> None:
    """A/B/n: adding an arm is a config change only; a query filters arms by `$arm` (whose
    values Prometheus lists), never by a name."""
    for title, expr, _ in panel_queries(build_dashboard()):
        assert arm_matchers(expr) <= {"$arm"}, (title, expr)


def test_recording_rules_are_used_where_they_exist() -> None:
    exprs = " ".join(expr for _, expr, _ in panel_queries(build_dashboard()))
    for name in (
        m.RECORDED_REQUEST_RATE,
        m.RECORDED_FAILED_RATIO,
        m.RECORDED_TOKENS_PER_EVENT,
        m.RECORDED_P99_RATIO,
    ):
        assert name in _recorded(), name
        assert name in exprs, name


def test_every_panel_has_a_unit() -> None:
    for panel in _panels(build_dashboard()):
        unit = panel["fieldConfig"]["defaults"].get("unit")
        assert unit and unit != "short", panel["title"]


def test_percentiles_come_with_a_mean_and_never_mix_streamed_and_not() -> None:
    for panel in _panels(build_dashboard()):
        exprs = [t["expr"] for t in panel["targets"]]
        quantiles = [e for e in exprs if "histogram_quantile(0.99" in e]
        if not quantiles:
            continue
        assert any("_sum" in e and "_count" in e for e in exprs), panel["title"]
        if m.REQUEST_DURATION in " ".join(quantiles):
            assert all("stream" in e for e in exprs if m.REQUEST_DURATION in e), panel["title"]


def test_sdk_loads_the_dashboard_and_round_trips_it() -> None:
    """grafana-foundation-sdk's typed model: every panel, option and query survives."""
    register_default_plugins()
    original = json.loads(COMMITTED.read_text(encoding="utf-8"))
    model = Dashboard.from_json(original)
    once = json.loads(json.dumps(model, cls=JSONEncoder))
    twice = json.loads(json.dumps(Dashboard.from_json(once), cls=JSONEncoder))
    assert once == twice
    assert model.uid == DASHBOARD_UID and model.schema_version == original["schemaVersion"]
    assert len(once["panels"]) == len(original["panels"])
    for before, after in zip(original["panels"], once["panels"], strict=True):
        for key in ("title", "type", "gridPos", "description"):
            assert after.get(key) == before.get(key), (before["title"], key)
        if before["type"] == "row":
            continue
        assert after["fieldConfig"]["defaults"]["unit"] == before["fieldConfig"]["defaults"]["unit"]
        assert [(t["expr"], t["legendFormat"]) for t in after["targets"]] == [
            (t["expr"], t["legendFormat"]) for t in before["targets"]
        ], before["title"]
    variables = {v["name"]: v for v in once["templating"]["list"]}
    assert variables["model"]["allValue"] == ".*" and variables["instance"]["multi"]


def test_speedup_band_fills_between_lower_and_upper() -> None:
    band_panels = [p for p in _panels(build_dashboard()) if p["title"].startswith("Speedup over")]
    assert len(band_panels) == 3
    for panel in band_panels:
        assert [t["legendFormat"] for t in panel["targets"]] == ["estimate", "lower", "upper"]
        upper = next(
            o for o in panel["fieldConfig"]["overrides"] if o["matcher"]["options"] == "upper"
        )
        assert {"id": "custom.fillBelowTo", "value": "lower"} in upper["properties"]


def test_speedup_by_band_per_dimension_and_crossover_with_bounds() -> None:
    """Issue 26 item 5: every dimension and the crossover, each with estimate/lower/upper."""
    exprs = [expr for _, expr, _ in panel_queries(build_dashboard())]
    for dimension in ("load", "prompt", "output", "temperature", "category"):
        for bound in ("estimate", "lower", "upper"):
            assert any(
                m.SEGMENT_SPEEDUP in e
                and f'dimension="{dimension}"' in e
                and f'bound="{bound}"' in e
                for e in exprs
            ), (dimension, bound)
    for bound in ("estimate", "lower", "upper"):
        assert any(m.CROSSOVER_LOAD in e and f'bound="{bound}"' in e for e in exprs), bound
    assert all('arm=~"$arm"' in e for e in exprs if m.SEGMENT_SPEEDUP in e or m.CROSSOVER_LOAD in e)


def test_a_verdict_row_per_treatment_after_an_overview_of_all() -> None:
    """A/B/n: the overview row lists every selected treatment (its table keeps `arm`); the
    verdict row repeats once per selected treatment, its panels titled by that one."""
    panels = build_dashboard()["panels"]
    rows = [p for p in panels if p["type"] == "row"]
    assert rows[0]["title"].startswith("Overview") and "repeat" not in rows[0]
    assert rows[1]["repeat"] == "arm" and "$arm" in rows[1]["title"]
    assert [r for r in rows if "repeat" in r] == [rows[1]]  # one repeated row
    variables = {v["name"]: v for v in build_dashboard()["templating"]["list"]}
    assert variables["arm"]["multi"] and variables["arm"]["includeAll"]
    start, end = panels.index(rows[1]), panels.index(rows[2])
    repeated = panels[start + 1 : end]
    assert repeated and all("$arm" in p["title"] or "arm" in str(p["targets"]) for p in repeated)
    overview = panels[panels.index(rows[0]) + 1 : start]
    table = next(p for p in overview if p["title"].startswith("Speedup with confidence"))
    organize = next(t for t in table["transformations"] if t["id"] == "organize")
    assert organize["options"]["indexByName"]["arm"] == 0
    assert all("without (bound, instance, pod)" in t["expr"] for t in table["targets"])
    # and every configured arm with its role and labels (`[arms.NAME] labels`: label_KEY)
    arms = next(p for p in overview if p["title"] == "Arms: role and labels")
    (target,) = arms["targets"]
    assert f"{m.ARM}_info" in target["expr"] and target["instant"]
    organize = next(t for t in arms["transformations"] if t["id"] == "organize")
    assert organize["options"]["indexByName"] == {"arm": 0, "role": 1}
