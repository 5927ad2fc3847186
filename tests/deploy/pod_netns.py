"""Run the rendered pods' processes as the pods would, in a private network and mount namespace.

Started by tests/deploy/test_pod.py as `unshare --net --mount -- python -m tests.deploy.pod_netns`
with a JSON spec on stdin. Inside, nothing is shared with the machine: its own loopback (so the
ConfigMap's exact `0.0.0.0:8000` and the emulators' ports are free), `/etc/hosts` naming the
Services, fresh tmpfs mounts where the pod has emptyDirs (`/var/lib/specproxy`, `/tmp`), and the
root filesystem read-only, as `readOnlyRootFilesystem` makes it.
The processes run as the image's UID/GID (setpriv). Writes a JSON report of every probe to stdout.
With `"mode": "stats"` in the spec it runs the stats Deployment's container instead
(`stats_pod`): its exact command against a throw-away PostgreSQL reached through its socket
directory, until it stored results, then SIGTERM.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

CONFIG_DIR = Path("/run/specproxy-config")  # stands in for the ConfigMap mount /etc/specproxy


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True)


def get(url: str, body: bytes | None = None) -> tuple[int, dict[str, str], bytes]:
    headers = {"Content-Type": "application/json"} if body else {}
    request = urllib.request.Request(url, data=body, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def wait_for(url: str, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            get(url)
            return True
        except OSError:
            time.sleep(0.2)
    return False


def wait_status(url: str, status: int, deadline_s: float) -> int:
    """Poll `url` until it answers `status` (or the deadline): the last status seen."""
    end = time.monotonic() + deadline_s
    seen = 0
    while time.monotonic() < end:
        try:
            seen = get(url)[0]
        except OSError:
            seen = 0
        if seen == status:
            break
        time.sleep(0.5)
    return seen


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


def is_stats_process(pid: int) -> bool:
    try:
        return b"--follow" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def start(argv: list[str], env: dict[str, str], uid: int) -> subprocess.Popen[bytes]:
    """`argv` as the image's non-root UID/GID. It keeps only CAP_DAC_READ_SEARCH, so it can reach
    this checkout's Python (which may sit under a private home) but write only where that UID
    may: the emptyDir stand-ins."""
    ids = [f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
    ids += ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]
    return subprocess.Popen(
        ["setpriv", *ids, *argv], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )


def _read_only(directory: str) -> bool:
    try:
        with open(os.path.join(directory, "specproxy-write-probe"), "w"):
            return False
    except OSError as exc:
        return exc.errno == errno.EROFS


def _program_paths() -> list[Path]:
    """This checkout and its Python: what the pod's processes run. Top-most paths only."""
    paths = sorted(
        {Path.cwd().resolve(), Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()}
    )
    return [p for p in paths if not any(q != p and p.is_relative_to(q) for q in paths)]


def _stash_hidden(empty_dir: str, keep: list[str] = []) -> list[tuple[Path, Path]]:  # noqa: B006
    """A checkout under an emptyDir's path (a clone in /tmp, say) would vanish under its tmpfs:
    bind it aside first (see `_restore`). The image has its program outside every emptyDir.
    `keep`: more paths to keep visible (the throw-away PostgreSQL's socket directory)."""
    stashed: list[tuple[Path, Path]] = []
    for path in [*_program_paths(), *map(Path, keep)]:
        if path.is_relative_to(empty_dir):
            aside = Path("/run/specproxy-keep", str(path).strip("/").replace("/", "_"))
            aside.mkdir(parents=True)
            sh("mount", "--bind", str(path), str(aside))
            stashed.append((path, aside))
    return stashed


def _restore(stashed: list[tuple[Path, Path]]) -> None:
    for path, aside in stashed:
        path.mkdir(parents=True, exist_ok=True)
        sh("mount", "--bind", str(aside), str(path))


def _pod_filesystem(spec: dict[str, Any]) -> dict[str, str]:
    """Loopback, /etc/hosts, the config, the emptyDirs, a read-only root; the pod's env."""
    uid = int(spec["uid"])
    sh("ip", "link", "set", "lo", "up")
    hosts = Path("/run/specproxy-hosts")
    sh("mount", "-t", "tmpfs", "tmpfs", "/run")  # private scratch for the files below
    hosts.write_text("127.0.0.1 localhost\n" + "".join(f"127.0.0.1 {h}\n" for h in spec["hosts"]))
    sh("mount", "--bind", str(hosts), "/etc/hosts")
    CONFIG_DIR.mkdir()
    (CONFIG_DIR / "specproxy.toml").write_text(spec["config"])
    for empty_dir in spec["empty_dirs"]:  # the pod's emptyDirs: fresh, owned by the pod's fsGroup
        if not os.path.isdir(empty_dir):  # e.g. /var/lib/specproxy: hide its parent here first
            sh("mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", os.path.dirname(empty_dir))
            os.mkdir(empty_dir)
        stashed = _stash_hidden(empty_dir, spec.get("keep", []))
        sh("mount", "-t", "tmpfs", "-o", f"mode=0770,uid={uid},gid={uid}", "tmpfs", empty_dir)
        _restore(stashed)
    # readOnlyRootFilesystem: everything but the tmpfs mounts above is read-only from here on.
    sh("mount", "-o", "remount,bind,ro", "/")
    env = {**spec["env"], "PATH": os.environ["PATH"], "PYTHONDONTWRITEBYTECODE": "1"}
    if "PYTHONPATH" in os.environ:  # this checkout's code, when it is not the installed one
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def stats_pod(spec: dict[str, Any]) -> dict[str, Any]:
    """The stats Deployment's container: its command until it stored `results` results (read
    from its PostgreSQL through `count_argv`), then SIGTERM."""
    env = _pod_filesystem(spec)
    report: dict[str, Any] = {"root_read_only": _read_only("/var/tmp")}
    stats = start(spec["stats_argv"], env, int(spec["uid"]))
    try:
        end = time.monotonic() + 180
        stored = 0
        while time.monotonic() < end and stats.poll() is None:
            done = subprocess.run(spec["count_argv"], capture_output=True, text=True, check=False)
            stored = int(done.stdout.strip() or 0) if done.returncode == 0 else 0
            if stored >= spec["results"]:
                break
            time.sleep(0.5)
        report["stored"] = stored
        stats.send_signal(signal.SIGTERM)
        report["sigterm_exit"] = stats.wait(timeout=spec["grace_s"])
    finally:
        if stats.poll() is None:
            stats.kill()
        stats.wait()
        report["stderr_tail"] = (stats.stderr.read() if stats.stderr else b"")[-3000:].decode()
    return report


def main() -> int:
    spec: dict[str, Any] = json.load(sys.stdin)
    if spec.get("mode") == "stats":
        json.dump(stats_pod(spec), sys.stdout)
        return 0
    uid = int(spec["uid"])
    env = _pod_filesystem(spec)
    report: dict[str, Any] = {"root_read_only": _read_only("/var/tmp")}
    proxy = start(spec["proxy_argv"], env, uid)
    emulators: list[subprocess.Popen[bytes]] = []
    try:
        base = f"http://127.0.0.1:{spec['port']}"
        report["proxy_listening"] = wait_for(base + "/healthz", 60)
        for path in ("/healthz", "/readyz", "/metrics"):
            report[f"arms_down {path}"] = get(base + path)[0]
        emulators = [start(argv, env, uid) for argv in spec["emulator_argvs"]]
        report["emulators_listening"] = [wait_for(url, 60) for url in spec["emulator_health"]]
        for path in ("/healthz", "/readyz"):
            report[f"arms_up {path}"] = get(base + path)[0]
        body = json.dumps(
            {
                "model": spec["model"],
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 8,
            }
        ).encode()
        status, headers, _ = get(base + "/v1/chat/completions", body)
        report["completion"] = [status, headers.get("x-specproxy-arm")]
        metrics = get(base + "/metrics")[2].decode()
        report["metrics_has_requests"] = "specproxy_requests_total{" in metrics
        # the pod's own stats process (compute = "child") computes; the proxy serves its result
        report["api_stats"] = wait_status(base + "/api/stats", 200, 180)
        stats_children = [pid for pid in children(proxy.pid) if is_stats_process(pid)]
        report["stats_children"] = len(stats_children)
        proxy.send_signal(signal.SIGTERM)
        report["sigterm_exit"] = proxy.wait(timeout=spec["grace_s"])
        report["stats_children_left"] = sum(alive(pid) for pid in stats_children)
        report["store_dir_files"] = sorted(os.listdir(spec["store_dir"]))
    finally:
        for process in [proxy, *emulators]:
            if process.poll() is None:
                process.kill()
            process.wait()
        report["proxy_stderr_tail"] = (proxy.stderr.read() if proxy.stderr else b"")[
            -2000:
        ].decode()
    json.dump(report, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
