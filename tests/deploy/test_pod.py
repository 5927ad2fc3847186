"""The demo overlay's pods run for real, as rendered: `specproxy serve` with exactly the
ConfigMap's specproxy.toml (listening on its 0.0.0.0:8000, the container port), the store URL
from the rendered Secret, the emulated arms with their Deployments' exact command lines, under
the image's UID, with tmpfs where the pod has emptyDirs and the rest of the filesystem
read-only. A private network and mount namespace (`unshare`, tests/deploy/pod_netns.py) gives
them their own loopback and /etc/hosts naming the Services, so nothing is adapted but the config
file's path (/run/specproxy-config instead of the ConfigMap mount /etc/specproxy, which does not
exist on this machine)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import urlsplit

from tests.conftest import require_binary
from tests.deploy.kube import REPO, find, render
from tests.deploy.pod_netns import CONFIG_DIR
from tests.deploy.test_kubernetes import config_toml, dockerfile_uid, proxy_container


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


def test_the_demo_pod_serves_on_its_container_port_with_its_exact_config() -> None:
    spec = pod_spec()
    # The config names the Services the namespace's /etc/hosts resolves.
    for url in (line.split('"')[1] for line in spec["config"].splitlines() if "_url = " in line):
        assert urlsplit(url).hostname in spec["hosts"]
    assert spec["empty_dirs"] == ["/tmp", "/var/lib/specproxy"]
    unshare = require_binary("unshare")
    require_binary("ip")
    require_binary("setpriv")
    result = subprocess.run(
        [unshare, "--net", "--mount", "--", sys.executable, "-m", "tests.deploy.pod_netns"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
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
    assert report["sigterm_exit"] == 0, context  # drained and flushed within the grace period
    # The Secret's SQLite URL points into the data emptyDir, where the store wrote its file.
    assert spec["store_dir"] in spec["empty_dirs"]
    assert "specproxy.db" in report["store_dir_files"]
