"""The overlays' pods run for real, as rendered. The demo's: `specproxy serve` with exactly the
ConfigMap's specproxy.toml (listening on its 0.0.0.0:8000, the container port), the store URL
from the rendered Secret, the emulated arms with their Deployments' exact command lines, under
the image's UID, with tmpfs where the pod has emptyDirs and the rest of the filesystem
read-only. A private network and mount namespace (`unshare`, tests/deploy/pod_netns.py) gives
them their own loopback and /etc/hosts naming the Services, so nothing is adapted but the config
file's path (/run/specproxy-config instead of the ConfigMap mount /etc/specproxy, which does not
exist on this machine). The production overlay's stats Deployment: its exact command and
config against a throw-away PostgreSQL."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import subprocess
import sys
import time
import tomllib
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from aiohttp.test_utils import TestClient, TestServer

from specproxy.app import create_app
from specproxy.config import Config, StoreConfig
from specproxy.store.factory import open_store
from tests.conftest import require_binary
from tests.deploy.kube import REPO, find, render
from tests.deploy.pod_netns import CONFIG_DIR
from tests.deploy.test_kubernetes import (
    config_toml,
    dockerfile_uid,
    proxy_container,
    stats_deployment,
)
from tests.stats.job.runs import records
from tests.store.pgcluster import PgCluster, find_pg_bin


def _program(argv: list[str]) -> list[str]:
    """The container's command with `specproxy` run from this checkout's Python."""
    assert argv[0] == "specproxy"
    return [sys.executable, "-m", "specproxy", *argv[1:]]


def pod_spec() -> dict[str, Any]:
    objects = render("demo")
    container = proxy_container(objects)
    deployment = find(objects, "Deployment", "specproxy")["spec"]["template"]["spec"]
    args = [a.replace("/etc/specproxy", str(CONFIG_DIR)) for a in container["args"]]
    secret = find(objects, "Secret", "specproxy-store")
    ref = container["env"][0]["valueFrom"]["secretKeyRef"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env[container["env"][0]["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    volumes = {v["name"]: v for v in deployment["volumes"]}
    empty_dirs = [
        m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]
    ]
    emulators, health, hosts = [], [], [find(objects, "Service", "specproxy")["metadata"]["name"]]
    for arm in ("baseline", "speculative"):
        [emulator] = find(objects, "Deployment", f"specproxy-arm-{arm}")["spec"]["template"][
            "spec"
        ]["containers"]
        emulators.append(_program(emulator["command"] + emulator["args"]))
        service = find(objects, "Service", f"specproxy-arm-{arm}")
        hosts.append(service["metadata"]["name"])
        health.append(f"http://127.0.0.1:{service['spec']['ports'][0]['port']}/health")
    return {
        "uid": dockerfile_uid(),
        "hosts": hosts,
        "config": config_toml(objects),
        "empty_dirs": sorted(empty_dirs),
        "env": env,
        "port": container["ports"][0]["containerPort"],
        "proxy_argv": _program(["specproxy", "serve", *args]),
        "emulator_argvs": emulators,
        "emulator_health": health,
        "model": "demo-model",
        "grace_s": deployment["terminationGracePeriodSeconds"],
        "store_dir": str(
            PurePosixPath("/" + urlsplit(env["SPECPROXY_STORE__URL"]).path.lstrip("/")).parent
        ),
    }


def run_pod(spec: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
    """`spec` run by tests/deploy/pod_netns.py in a private network and mount namespace, under
    the image's UID (setpriv); its report."""
    unshare = require_binary("unshare")
    require_binary("setpriv")
    result = subprocess.run(
        [unshare, "--net", "--mount", "--", sys.executable, "-m", "tests.deploy.pod_netns"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=timeout_s,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report: dict[str, Any] = json.loads(result.stdout)
    return report


def test_the_demo_pod_serves_on_its_container_port_with_its_exact_config() -> None:
    spec = pod_spec()
    # The config names the Services the namespace's /etc/hosts resolves.
    for url in (line.split('"')[1] for line in spec["config"].splitlines() if "_url = " in line):
        assert urlsplit(url).hostname in spec["hosts"]
    assert spec["empty_dirs"] == ["/tmp", "/var/lib/specproxy"]
    require_binary("ip")
    report = run_pod(spec, timeout_s=240)
    context = report.pop("proxy_stderr_tail")
    assert report["root_read_only"]  # readOnlyRootFilesystem: only the emptyDirs are writable
    assert report["proxy_listening"], context
    # Liveness answers whether or not the arms do; readiness only once both arms answer.
    assert report["arms_down /healthz"] == 200
    assert report["arms_down /readyz"] == 503
    assert report["arms_down /metrics"] == 200
    assert report["emulators_listening"] == [True, True], context
    assert report["arms_up /healthz"] == 200
    assert report["arms_up /readyz"] == 200, context
    assert report["completion"][0] == 200 and report["completion"][1] in ("baseline", "speculative")
    assert report["metrics_has_requests"]
    # one stats process, the pod's own (compute = "child"), whose result the proxy serves
    assert report["stats_children"] == 1, context
    assert report["api_stats"] == 200, context
    assert report["sigterm_exit"] == 0, context  # drained and flushed within the grace period
    assert report["stats_children_left"] == 0  # stopped with the proxy
    # The Secret's SQLite URL points into the data emptyDir, where the store wrote its file.
    assert spec["store_dir"] in spec["empty_dirs"]
    assert "specproxy.db" in report["store_dir_files"]


def stats_pod_spec(objects: list[dict[str, Any]], pg: PgCluster, db: str) -> dict[str, Any]:
    """The production overlay's stats Deployment as `pod_netns.stats_pod` runs it: its exact
    command and args (the config path aside), its env with the store Secret's stand-in, a URL to
    the throw-away PostgreSQL through its socket directory (no network in the namespace)."""
    stats = stats_deployment(objects)
    assert stats is not None
    pod = stats["spec"]["template"]["spec"]
    [container] = pod["containers"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    env["SPECPROXY_STORE__URL"] = f"postgresql://postgres@/{db}?host={pg.root}&port={pg.port}"
    psql = find_pg_bin("psql")
    assert psql is not None
    count = ["-U", "postgres", "-d", db, "-tAc"]
    count.append(f"SELECT count(*) FROM stats_history WHERE run_id = '{RUN}'")
    return {
        "mode": "stats",
        "uid": dockerfile_uid(),
        "hosts": [],
        "config": config_toml(objects),
        "empty_dirs": sorted(
            m["mountPath"] for m in container["volumeMounts"] if "emptyDir" in volumes[m["name"]]
        ),
        "keep": [str(pg.root)],
        "env": env,
        "stats_argv": _program(
            [a.replace("/etc/specproxy", str(CONFIG_DIR)) for a in container["command"]]
            + [a.replace("/etc/specproxy", str(CONFIG_DIR)) for a in container["args"]]
        ),
        "count_argv": [psql, "-h", str(pg.root), "-p", str(pg.port), *count],
        "results": 2,
        "grace_s": pod["terminationGracePeriodSeconds"],
    }


RUN = "production"


async def _seed(url: str) -> None:
    """Records of the production config's run, from the last minute, as the proxies write them."""
    store = open_store(StoreConfig(url=url), run_id=RUN)
    await store.start()
    for rec in records(400, time.time() - 60, 1.5, 1):
        store.record(dataclasses.replace(rec, run_id=RUN))
    await store.close()


async def _served(cfg: Config) -> dict[str, Any]:
    """What a proxy with the production ConfigMap (compute = "external") serves at /api/stats."""
    async with TestClient(TestServer(create_app(cfg))) as client:
        for _ in range(1200):  # a slow machine only takes longer
            resp = await client.get("/api/stats")
            if resp.status == 200:
                result: dict[str, Any] = await resp.json()
                return result
            await asyncio.sleep(0.1)
    raise AssertionError("the proxy served no stored result")


def test_the_stats_pod_computes_with_its_exact_command_and_config() -> None:
    """The production overlay's specproxy-stats container, as rendered: `specproxy stats
    --follow` with the ConfigMap's specproxy.toml, under the image's UID on a read-only root
    with its emptyDirs, computes from the store the proxies write, stores results and exits 0 on
    SIGTERM within its grace period; a proxy with the same ConfigMap serves what it stored."""
    initdb = require_binary("initdb", *(p for p in [find_pg_bin("initdb")] if p))
    objects = render("production")
    cluster = PgCluster(initdb)
    cluster.start()
    try:
        url = cluster.create_database("stats_pod")
        asyncio.run(_seed(url))
        spec = stats_pod_spec(objects, cluster, "stats_pod")
        assert spec["empty_dirs"] == ["/tmp", "/var/lib/specproxy"]
        report = run_pod(spec, timeout_s=400)
        context = report.pop("stderr_tail")
        assert report["root_read_only"]
        assert report["stored"] >= 2, context
        assert report["sigterm_exit"] == 0, context
        assert "Traceback" not in context, context
        data = tomllib.loads(config_toml(objects))
        data["store"]["url"] = url  # the Secret's stand-in, as SPECPROXY_STORE__URL gives it
        cfg = Config.from_mapping(data)
        assert cfg.stats.compute == "external" and cfg.run_id == RUN
        served = asyncio.run(_served(cfg))
        assert served["run_id"] == RUN and set(served["results"]["all"]) == {"5m", "1h", "all"}
        assert sum(served["results"]["all"]["all"]["samples"].values()) >= 300
    finally:
        cluster.close()
