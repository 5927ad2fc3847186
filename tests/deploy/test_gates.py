"""deploy/kubernetes/gates: the Argo Rollouts AnalysisTemplates and the Flagger MetricTemplate
that gate a canary on specproxy's rollout gate (`stats.gate`).

- Every object (the kustomizations' and the example Rollout and Canary) is strictly valid
  against the vendored Argo Rollouts v1.9.1 and Flagger v1.44.0 CRD schemas; an unknown field
  fails.
- The web provider's request (URL and Authorization header with the args resolved), its
  jsonPath and its conditions run against a REAL `/api/stats` answer: the app on a memory://
  store, its own stats job, known-truth records (speculation 1.5x faster, 1.5x slower, or the
  same: A/A), the admin token on. The jsonPath is evaluated by kubectl's JSONPath printer
  (k8s.io/client-go util/jsonpath, the package Argo's web provider uses); the conditions and
  the measurement / metric phases by ports of Argo v1.9.1's `evaluate.EvaluateResult` and
  `analysis.assessMetricStatus` for the condition forms the templates use.
- The Prometheus queries (Argo's and Flagger's, variables substituted) run in promtool's PromQL
  engine on the series the real collector exports, for each gate state, none, and replicas
  that disagree.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import subprocess
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, cast

import aiohttp
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specproxy import metrics as names
from specproxy.app import create_app
from specproxy.appkeys import STORE
from specproxy.config import Config, StatsConfig, StoreConfig, WarmupConfig
from specproxy.stats.collector import register_stats_collector
from specproxy.stats.result import GateState, StatsResult
from tests.deploy.kube import KUBERNETES, find, render_dir, schema_errors, tool
from tests.deploy.rulefiles import promtool
from tests.stats.job.runs import RUN, records

Obj = dict[str, Any]

GATES = KUBERNETES / "gates"
ARGO = GATES / "argo-rollouts"
FLAGGER = GATES / "flagger"
TOKEN = "gate-test-token-0123456789abcdef"
SPECPROXY_NAMESPACE = "specproxy"  # the production overlay's; the ServiceMonitor's target label


def _example(path: Path) -> Obj:
    loaded: Obj = yaml.safe_load(path.read_text(encoding="utf-8"))
    return loaded


@functools.cache
def _rendered(path: Path) -> str:
    return yaml.safe_dump_all(render_dir(path))


def argo_objects() -> list[Obj]:
    """The argo-rollouts kustomization's objects (a fresh copy each call; rendered once)."""
    return list(yaml.safe_load_all(_rendered(ARGO)))


def flagger_objects() -> list[Obj]:
    return list(yaml.safe_load_all(_rendered(FLAGGER)))


def all_objects() -> list[Obj]:
    return [
        *argo_objects(),
        *flagger_objects(),
        _example(ARGO / "example-rollout.yaml"),
        _example(FLAGGER / "example-canary.yaml"),
    ]


def web_metric() -> tuple[Obj, Obj]:
    """(the web AnalysisTemplate, its one metric)."""
    template = find(argo_objects(), "AnalysisTemplate", "specproxy-gate-web")
    [metric] = template["spec"]["metrics"]
    return template, metric


def prometheus_metric() -> tuple[Obj, Obj]:
    template = find(argo_objects(), "AnalysisTemplate", "specproxy-gate-prometheus")
    [metric] = template["spec"]["metrics"]
    return template, metric


# --- strict validation --------------------------------------------------------------------------


def test_gate_objects_are_strictly_valid() -> None:
    objects = all_objects()
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == ["AnalysisTemplate", "AnalysisTemplate", "Canary", "MetricTemplate", "Rollout"]
    errors = {f"{o['kind']}/{o['metadata']['name']}": schema_errors(o) for o in objects}
    assert {name: e for name, e in errors.items() if e} == {}


@pytest.mark.parametrize(
    ("kind", "name", "path", "key"),
    [
        ("AnalysisTemplate", "specproxy-gate-web", ("spec", "metrics", 0), "successCondtion"),
        (
            "AnalysisTemplate",
            "specproxy-gate-web",
            ("spec", "metrics", 0, "provider", "web"),
            "jsonpath",
        ),
        (
            "AnalysisTemplate",
            "specproxy-gate-prometheus",
            ("spec", "metrics", 0, "provider", "prometheus"),
            "adress",
        ),
        ("AnalysisTemplate", "specproxy-gate-web", ("metadata",), "labelz"),
        ("MetricTemplate", "specproxy-gate", ("spec",), "querry"),
        ("Canary", "vllm", ("spec", "analysis", "metrics", 0), "thresholdrange"),
        ("Rollout", "vllm", ("spec", "strategy", "canary"), "stableSvc"),
    ],
)
def test_an_unknown_field_fails_validation(
    kind: str, name: str, path: tuple[str | int, ...], key: str
) -> None:
    obj = find(all_objects(), kind, name)
    assert schema_errors(obj) == []
    node: Any = obj
    for step in path:
        node = node[step]
    node[key] = {}
    [error] = schema_errors(obj)
    assert key in error


def test_the_examples_name_the_templates_and_specproxys_arms() -> None:
    rollout = _example(ARGO / "example-rollout.yaml")
    canary = rollout["spec"]["strategy"]["canary"]
    [analysis] = [s["analysis"] for s in canary["steps"] if "analysis" in s]
    templates = {o["metadata"]["name"] for o in argo_objects()}
    assert {t["templateName"] for t in analysis["templates"]} <= templates
    # the canary and stable Services are the base config's speculative and baseline arms
    base = (KUBERNETES / "base" / "specproxy.toml").read_text(encoding="utf-8")
    assert f'speculative_url = "http://{canary["canaryService"]}:8000"' in base
    assert f'baseline_url = "http://{canary["stableService"]}:8000"' in base
    flagger = _example(FLAGGER / "example-canary.yaml")
    [metric] = flagger["spec"]["analysis"]["metrics"]
    template = find(flagger_objects(), "MetricTemplate", metric["templateRef"]["name"])
    used = set(re.findall(r"\{\{\s*variables\.(\w+)\s*\}\}", template["spec"]["query"]))
    assert used == set(metric["templateVariables"])
    assert metric["thresholdRange"] == {"min": 1}  # only "pass" passes a check


def test_template_args_are_declared_and_default_to_the_specproxy_service() -> None:
    for template, metric in (web_metric(), prometheus_metric()):
        declared = {a["name"] for a in template["spec"]["args"]}
        assert set(re.findall(r"\{\{\s*args\.([\w-]+)\s*\}\}", json.dumps(metric))) == declared
    template, _ = web_metric()
    args = {a["name"]: a for a in template["spec"]["args"]}
    # the production overlay's Service `specproxy` (port 8000) in namespace specproxy
    assert args["stats-url"]["value"] == (
        f"http://specproxy.{SPECPROXY_NAMESPACE}.svc:8000/api/stats"
    )
    assert args["admin-token"]["valueFrom"]["secretKeyRef"] == {
        "name": "specproxy-admin",
        "key": "token",
    }


# --- Argo's semantics (ports of argo-rollouts v1.9.1, for the forms the templates use) ----------


def resolve_args(text: str, args: dict[str, str]) -> str:
    """`{{args.NAME}}` substituted, as Argo's ResolveMetricArgs does for every metric field."""
    return re.sub(r"\{\{\s*args\.([\w-]+)\s*\}\}", lambda m: args[m.group(1)], text)


def condition(expr: str, result: Any) -> bool:
    """expr-lang on the two condition forms the templates use: `result == "word"` (web: the
    jsonPath value) and `result[0] == N` (prometheus: a vector's values as []float64)."""
    if m := re.fullmatch(r'result == "(\w+)"', expr):
        return bool(result == m.group(1))
    if m := re.fullmatch(r"result\[0\] == (-?\d+)", expr):
        if not result:
            raise IndexError("index out of range: 0 (an error measurement in Argo)")
        return bool(result[0] == float(m.group(1)))
    raise AssertionError(f"a condition outside the evaluated subset: {expr!r}")


def measurement_phase(metric: Obj, result: Any) -> str:
    """evaluate.EvaluateResult: failure wins; neither condition true is Inconclusive."""
    success = condition(metric["successCondition"], result)
    failure = condition(metric["failureCondition"], result)
    if failure:
        return "Failed"
    return "Successful" if success else "Inconclusive"


def metric_phase(metric: Obj, phases: list[str]) -> tuple[str, int]:
    """analysis.assessMetricStatus after each measurement: (the metric's phase, measurements
    taken when it completed, or all of them while Running)."""
    failure_limit = int(metric.get("failureLimit", 0))
    inconclusive_limit = int(metric.get("inconclusiveLimit", 0))
    success_limit = int(metric.get("consecutiveSuccessLimit", 0))
    count = int(metric["count"])
    failed = inconclusive = consecutive = 0
    for taken, phase in enumerate(phases, start=1):
        failed += phase == "Failed"
        inconclusive += phase == "Inconclusive"
        consecutive = consecutive + 1 if phase == "Successful" else 0
        verdict = ""
        if failure_limit >= 0 and failed > failure_limit:
            verdict = "Failed"
        if inconclusive > inconclusive_limit:
            verdict = "Inconclusive"
        if verdict:
            return verdict, taken
        if success_limit > 0 and consecutive >= success_limit:
            return "Successful", taken
        if taken >= count:
            if failure_limit >= 0 and success_limit > 0:
                return "Inconclusive", taken
            return ("Failed" if success_limit > 0 else "Successful"), taken
    return "Running", len(phases)


@pytest.mark.parametrize(
    ("state", "phase"),
    [("pass", "Successful"), ("fail", "Failed"), ("wait", "Inconclusive")],
)
def test_each_gate_state_is_one_measurement_phase(state: str, phase: str) -> None:
    _, web_m = web_metric()
    assert measurement_phase(web_m, state) == phase
    _, prom_m = prometheus_metric()
    value = {"pass": 1.0, "fail": -1.0, "wait": 0.0}[state]
    assert measurement_phase(prom_m, [value]) == phase


def test_no_prometheus_series_is_an_error_measurement_without_the_vector_fallback() -> None:
    """Why the queries end in `or vector(0)`: an empty vector would make `result[0]` an error."""
    _, metric = prometheus_metric()
    with pytest.raises(IndexError):
        measurement_phase(metric, [])
    assert metric["provider"]["prometheus"]["query"].rstrip().endswith("or vector(0)")


@pytest.mark.parametrize(
    ("states", "phase", "taken"),
    [
        (["wait"] * 5 + ["pass", "pass"], "Successful", 7),  # two passes in a row
        (["pass", "wait", "pass", "pass"], "Successful", 4),
        (["wait"] * 3 + ["fail"], "Failed", 4),  # the first fail aborts
        (["wait"] * 60, "Inconclusive", 60),  # no verdict in count x interval: paused
        (["pass"] + ["wait"] * 59, "Inconclusive", 60),
        (["wait"] * 59, "Running", 59),  # waiting never ends the metric early
    ],
)
def test_the_metric_ends_on_the_gate_as_documented(
    states: list[str], phase: str, taken: int
) -> None:
    for _, metric in (web_metric(), prometheus_metric()):
        values: list[Any] = (
            states
            if "web" in metric["provider"]
            else [[{"pass": 1.0, "fail": -1.0, "wait": 0.0}[s]] for s in states]
        )
        phases = [measurement_phase(metric, v) for v in values]
        assert metric_phase(metric, phases) == (phase, taken)


# --- the web provider against a real /api/stats -------------------------------------------------

N_RECORDS = 1600


@pytest.fixture
async def stats_app() -> AsyncIterator[TestClient[web.Request, web.Application]]:
    """The real app on memory:// (its stats job runs in-process), arms closed, the admin token
    on, whole-run window only."""
    cfg = Config(
        baseline_url="http://127.0.0.1:9",
        speculative_url="http://127.0.0.1:9",
        run_id=RUN,
        store=StoreConfig(url="memory://", flush_interval_s=0.05),
        stats=StatsConfig(interval_s=0.2, resamples=200, windows_s=(None,)),
        warmup=WarmupConfig(requests=0),
    )
    app = create_app(cfg, registry=CollectorRegistry(), admin_token=TOKEN)
    client: TestClient[web.Request, web.Application] = TestClient(TestServer(app))
    await client.start_server()
    try:
        yield client
    finally:
        await client.close()


def kubernetes_jsonpath(document: Obj, expression: str) -> str:
    """kubectl's JSONPath printer (k8s.io/client-go/util/jsonpath) on `document`, carried as a
    local object (the apiVersion, kind and metadata it needs are added; no cluster)."""
    obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stats"}, **document}
    result = subprocess.run(
        [
            tool("kubectl"),
            "label",
            "--local",
            "-f",
            "-",
            "gate=read",
            "-o",
            f"jsonpath={expression}",
        ],
        input=json.dumps(obj),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


async def _stats_body(
    client: TestClient[web.Request, web.Application], template: Obj, metric: Obj
) -> Obj:
    """GET the metric's URL with its headers, args resolved as Argo does (the Secret's token),
    once the job's result holds every record."""
    args = {a["name"]: a.get("value", "") for a in template["spec"]["args"]}
    args["stats-url"] = str(client.make_url("/api/stats"))
    args["admin-token"] = TOKEN
    web_spec = metric["provider"]["web"]
    url = resolve_args(web_spec["url"], args)
    headers = {h["key"]: resolve_args(h["value"], args) for h in web_spec["headers"]}
    async with aiohttp.ClientSession() as session:
        async with session.get(url) as unauthorized:
            assert unauthorized.status == 401  # the header is what lets Argo in
        async with asyncio.timeout(120):
            while True:
                async with session.get(url, headers=headers) as resp:
                    if resp.status == 200:
                        body: Obj = await resp.json()
                        samples = body["results"]["all"]["all"]["samples"]
                        if sum(samples.values()) == N_RECORDS:
                            return body
                await asyncio.sleep(0.2)


@pytest.mark.parametrize(
    ("speedup", "state", "phase"),
    [(1.5, "pass", "Successful"), (1 / 1.5, "fail", "Failed"), (1.0, "wait", "Inconclusive")],
)
async def test_the_web_metric_on_a_real_api_stats(
    stats_app: TestClient[web.Request, web.Application],
    speedup: float,
    state: GateState,
    phase: str,
) -> None:
    app = stats_app.app
    t0 = time.time() - N_RECORDS * 0.1 - 5.0
    for rec in records(N_RECORDS, t0, speedup, seed=3):
        app[STORE].record(rec)
    template, metric = web_metric()
    body = await _stats_body(stats_app, template, metric)
    window = body["results"]["all"]["all"]
    assert window["gate"]["state"] == state, window["gate"]
    args = {"window": "all"}
    value = kubernetes_jsonpath(body, resolve_args(metric["provider"]["web"]["jsonPath"], args))
    assert value == state
    assert measurement_phase(metric, value) == phase


def test_a_window_missing_from_the_answer_reads_as_nothing() -> None:
    """kubectl's printer allows missing keys (Argo's parser does not: an error measurement);
    either way a window the job does not compute is never a pass."""
    _, metric = web_metric()
    body = {"results": {"all": {"all": {"gate": {"state": "pass"}}}}}
    path = metric["provider"]["web"]["jsonPath"]
    assert kubernetes_jsonpath(body, resolve_args(path, {"window": "all"})) == "pass"
    assert kubernetes_jsonpath(body, resolve_args(path, {"window": "5m"})) == ""


# --- the Prometheus queries in promtool's PromQL engine -----------------------------------------


def exported_gate_series(states: dict[str, GateState]) -> list[str]:
    """The `specproxy_gate` series the real collector exports for `{window: state}` (model
    "all"), in promtool's series notation, with the `namespace` and `instance` target labels the
    ServiceMonitor's scrape adds."""
    result = {
        "computed_at": 1.0,
        "results": {
            "all": {
                window: {
                    "samples": {},
                    "metrics": {},
                    "diagnosis": {},
                    "gate": {"state": s, "reasons": []},
                }
                for window, s in states.items()
            }
        },
    }
    registry = CollectorRegistry()
    register_stats_collector(registry, lambda: cast(StatsResult, result))
    text = generate_latest(registry).decode()
    out = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name != names.GATE:
                continue
            labels = {**sample.labels, "namespace": SPECPROXY_NAMESPACE}
            inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
            out.append(f"{sample.name}{{{inner}}} {sample.value:g}")
    return out


def _queries() -> dict[str, str]:
    _, argo = prometheus_metric()
    argo_args = {"specproxy-namespace": SPECPROXY_NAMESPACE, "model": "all", "window": "all"}
    template = find(flagger_objects(), "MetricTemplate", "specproxy-gate")
    [variables] = [
        m["templateVariables"]
        for m in _example(FLAGGER / "example-canary.yaml")["spec"]["analysis"]["metrics"]
    ]
    flagger = re.sub(
        r"\{\{\s*variables\.(\w+)\s*\}\}",
        lambda m: variables[m.group(1)],
        template["spec"]["query"],
    )
    return {
        "argo": resolve_args(argo["provider"]["prometheus"]["query"], argo_args),
        "flagger": flagger,
    }


def _promtool_case(instances: list[dict[str, GateState]], expected: float) -> dict[str, Any]:
    series = []
    for i, states in enumerate(instances):
        for line in exported_gate_series(states):
            selector, value = line.rsplit(" ", 1)
            with_instance = selector[:-1] + f',instance="proxy-{i}"}}'
            series.append({"series": with_instance, "values": f"{value}x5"})
    return {"series": series, "expected": expected}


CASES = {
    "pass": _promtool_case([{"all": "pass", "5m": "fail"}], 1),
    "fail": _promtool_case([{"all": "fail", "5m": "pass"}], -1),
    "wait": _promtool_case([{"all": "wait"}], 0),
    "no series yet": _promtool_case([], 0),
    "only another window": _promtool_case([{"5m": "pass"}], 0),
    "replicas pass and wait": _promtool_case([{"all": "pass"}, {"all": "wait"}], 1),
    "replicas pass and fail": _promtool_case([{"all": "pass"}, {"all": "fail"}], 0),
}


def test_the_prometheus_queries_read_the_gate(tmp_path: Path) -> None:
    tests = []
    for case in CASES.values():
        tests.append(
            {
                "interval": "1m",
                "input_series": case["series"],
                "promql_expr_test": [
                    {
                        "expr": query,
                        "eval_time": "2m",
                        "exp_samples": [{"labels": "{}", "value": case["expected"]}],
                    }
                    for query in _queries().values()
                ],
            }
        )
    path = tmp_path / "gate_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": tests}), encoding="utf-8")
    result = promtool("test", "rules", str(path), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_expectation_fails_promtool(tmp_path: Path) -> None:
    """The check above can fail: the pass case expected as a wait is reported."""
    case = CASES["pass"]
    test = {
        "interval": "1m",
        "input_series": case["series"],
        "promql_expr_test": [
            {
                "expr": _queries()["argo"],
                "eval_time": "2m",
                "exp_samples": [{"labels": "{}", "value": 0}],
            }
        ],
    }
    path = tmp_path / "gate_test.yml"
    path.write_text(yaml.safe_dump({"rule_files": [], "tests": [test]}), encoding="utf-8")
    assert promtool("test", "rules", str(path), cwd=tmp_path).returncode != 0
